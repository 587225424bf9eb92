# Hybrid emulation: the config's sandbox ranks run the job's real program, every other rank replayed on the
# calibrated clock. Runs only when the config has an `emulate` section; its settings are the rule's params,
# so changing them re-runs only this rule (and what reads emulation/).


rule emulate:  # runs alone: the sandbox's timings must not share the machine with another stage
    input:
        rules.capture.output,
        rules.graph.output,
        f"{JOB_DIR}/calibrated/timeline.parquet",
        f"{JOB_DIR}/calibrated/iterations.parquet",
    output:
        multiext(f"{JOB_DIR}/emulation/", "events.parquet", "iterations.parquet", "memory.parquet", "figures.parquet",
                 "delays.parquet", "summary.txt", "meta.json"),
    params:
        job=in_job(),
        options=emulate_options(),
    threads: stage_threads("emulate")
    resources:
        **rule_resources("emulate"),
    log:
        f"{JOB_DIR}/logs/emulate.log",
    conda:
        "../envs/runtime.yaml"
    shell:
        "$PY -m prism.emulate --job {params.job:q} --force {params.options} >> {log:q} 2>&1"
