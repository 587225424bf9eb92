# Context-switching capture of the W ranks on P slots, then the bare graph and its summary.

if not JOB.capture.payloads:
    raise ValueError(
        "capture.payloads: false: the pipeline's slice runs replay the capture's payloads; "
        "set capture.payloads: true (or leave the key out)"
    )


rule capture:  # runs alone: its timings must not share the machine with another stage
    output:
        raw=directory(f"{JOB_DIR}/capture/raw"),
        payloads=directory(f"{JOB_DIR}/capture/payloads"),  # read by the slice runs' replay servers
    params:
        section=section("capture"),
        out=lambda w, output: os.path.dirname(output.raw),
    threads: stage_threads("capture")
    resources:
        **rule_resources("capture"),
    log:
        f"{JOB_DIR}/logs/capture.log",
    conda:
        "../../environment.yml"
    shell:
        "$PY -m prism.capture --config-json {params.section:q} --out {params.out:q} --force >> {log:q} 2>&1"


rule graph:
    input:
        rules.capture.output.raw,
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
        "$PY -m prism.graph --job {params.job:q} --raw {input:q} --out {params.out:q} >> {log:q} 2>&1"


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
        "$PY -m prism.summary --job {params.job:q} >> {log:q} 2>&1"
