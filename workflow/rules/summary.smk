# The job's text summary (summary.txt), once the prediction exists. The catalog is catalog.smk's alone.


rule summary:
    input:
        rules.graph.output,
        f"{JOB_DIR}/calibrated/iterations.parquet",
    output:
        f"{JOB_DIR}/summary.txt",
    params:
        job=in_job(),
    threads: stage_threads("summary")
    resources:
        **rule_resources("summary"),
    log:
        f"{JOB_DIR}/logs/summary.log",
    conda:
        "../envs/analysis.yaml"
    shell:
        "$PY -m prism.summary --job {params.job:q} >> {log:q} 2>&1"
