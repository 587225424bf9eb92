# Context-switching capture of the W ranks on P slots, then the bare graph and its summary.


rule capture:  # runs alone: its timings must not share the machine with another stage
    output:
        directory(f"{JOB_DIR}/capture/raw"),
    params:
        section=section("capture"),
        out=lambda w, output: os.path.dirname(output[0]),
    threads: stage_threads("capture")
    resources:
        **rule_resources("capture"),
    log:
        f"{JOB_DIR}/logs/capture.log",
    conda:
        "../../environment.yml"
    shell:
        "$PY -m prism.capture --config-json {params.section:q} --out {params.out:q} --force > {log:q} 2>&1"


rule graph:
    input:
        rules.capture.output,
    output:
        multiext(f"{JOB_DIR}/graph/", "events.parquet", "comms.parquet", "groups.parquet", "ranks.parquet"),
    params:
        job=lambda w, output: os.path.dirname(os.path.dirname(output[0])),
        out=lambda w, output: os.path.dirname(output[0]),
    threads: stage_threads("graph")
    resources:
        **rule_resources("graph"),
    log:
        f"{JOB_DIR}/logs/graph.log",
    conda:
        "../../environment.yml"
    shell:
        "$PY -m prism.graph --job {params.job:q} --raw {input:q} --out {params.out:q} > {log:q} 2>&1"


rule summary:
    input:
        rules.graph.output,
        f"{JOB_DIR}/calibrated/iterations.parquet",
    output:
        f"{JOB_DIR}/summary.txt",
    params:
        job=lambda w, output: os.path.dirname(output[0]),
    threads: stage_threads("summary")
    resources:
        **rule_resources("summary"),
    log:
        f"{JOB_DIR}/logs/summary.log",
    conda:
        "../../environment.yml"
    shell:
        "$PY -m prism.summary --job {params.job:q} > {log:q} 2>&1"
