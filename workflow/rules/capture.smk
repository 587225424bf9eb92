# Context-switching capture of the W ranks on P device slots: the raw trace and the payloads the slice runs replay.

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
        out=in_job("capture"),
    threads: stage_threads("capture")
    resources:
        **rule_resources("capture"),
    log:
        f"{JOB_DIR}/logs/capture.log",
    conda:
        "../envs/runtime.yaml"
    shell:
        "$PY -m prism.capture --config-json {params.section:q} --out {params.out:q} --force >> {log:q} 2>&1"
