# The job's HTML report, after calibrate; also after the baseline and the emulation when the config has them (and
# after baseline-decision.json either way, so the page can say why no baseline ran). The output is report()-wrapped:
# `snakemake --report` links it.


rule report:
    input:
        f"{JOB_DIR}/calibrated/timeline.parquet",
        f"{JOB_DIR}/calibrated/iterations.parquet",
        f"{JOB_DIR}/summary.txt",
        [f"{JOB_DIR}/emulation/summary.txt"] if JOB.emulate.wanted else [],
        lambda w: baseline_targets(w, f"{JOB_DIR}/baseline/graph/events.parquet"),
    output:
        report(f"{JOB_DIR}/report/report.html", category="prism", labels={"file": "report"}),
    params:
        job=in_job(),
    threads: stage_threads("report")
    resources:
        **rule_resources("report"),
    log:
        f"{JOB_DIR}/logs/report.log",
    conda:
        "../envs/analysis.yaml"
    shell:
        "$PY -m prism.report --job {params.job:q} >> {log:q} 2>&1"
