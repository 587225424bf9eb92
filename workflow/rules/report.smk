# The job's HTML report, after calibrate; also after the baseline and the emulation when the config has them
# (the input function adds their outputs). The output is report()-wrapped: `snakemake --report` links it.


rule report:
    input:
        lambda w: [f"{JOB_DIR}/calibrated/timeline.parquet", f"{JOB_DIR}/calibrated/iterations.parquet",
                   f"{JOB_DIR}/summary.txt"]
        + ([f"{JOB_DIR}/baseline/graph/events.parquet"] if JOB.baseline.wanted(JOB.nproc) else [])
        + ([f"{JOB_DIR}/emulation/summary.txt"] if JOB.emulate.wanted else []),
    output:
        report(f"{JOB_DIR}/report/report.html", category="prism", labels={"file": "report"}),
    params:
        job=lambda w, output: os.path.dirname(os.path.dirname(output[0])),
    threads: stage_threads("report")
    resources:
        **rule_resources("report"),
    log:
        f"{JOB_DIR}/logs/report.log",
    conda:
        "../../environment.yml"
    shell:
        "$PY -m prism.report --job {params.job:q} >> {log:q} 2>&1"
