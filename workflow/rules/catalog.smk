# The job's DuckDB catalog, written last so that the prediction and the baseline sit side by side in it.


rule catalog:
    input:
        stage_targets(),
    output:
        f"{JOB_DIR}/prism.duckdb",
    params:
        job=lambda w, output: os.path.dirname(output[0]),
    threads: stage_threads("catalog")
    resources:
        **rule_resources("catalog"),
    log:
        f"{JOB_DIR}/logs/catalog.log",
    conda:
        "../../environment.yml"
    shell:
        "$PY -m prism.sql --job {params.job:q} --write-catalog >> {log:q} 2>&1"
