# The bare graph of the capture: events, comms, groups and ranks tables (graph/).


rule graph:
    input:
        rules.capture.output.raw,
    output:
        multiext(f"{JOB_DIR}/graph/", "events.parquet", "comms.parquet", "groups.parquet", "ranks.parquet"),
    params:
        job=in_job(),
        out=in_job("graph"),
    threads: stage_threads("graph")
    resources:
        **rule_resources("graph"),
    log:
        f"{JOB_DIR}/logs/graph.log",
    conda:
        "../envs/analysis.yaml"
    shell:
        "$PY -m prism.graph --job {params.job:q} --raw {input:q} --out {params.out:q} >> {log:q} 2>&1"
