# The job's DuckDB catalog (prism.duckdb), written last so that the prediction and the baseline sit side by side in
# it. This rule alone writes it: no stage touches it.


rule catalog:
    input:
        stage_targets(),
        baseline_summary,
    output:
        f"{JOB_DIR}/prism.duckdb",
    params:
        job=in_job(),
    threads: stage_threads("catalog")
    resources:
        **rule_resources("catalog"),
    log:
        f"{JOB_DIR}/logs/catalog.log",
    conda:
        "../envs/analysis.yaml"
    shell:
        "$PY -m prism.sql --job {params.job:q} --write-catalog >> {log:q} 2>&1"
