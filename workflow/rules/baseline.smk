# The real run of every rank (ground truth), its graph, and its summary.


rule baseline_run:  # runs alone: its timings must not share the machine with another stage
    output:
        directory(f"{JOB_DIR}/baseline/raw"),
    params:
        section=section("baseline"),
        out=lambda w, output: os.path.dirname(output[0]),
    threads: stage_threads("baseline_run")
    resources:
        **rule_resources("baseline_run"),
    log:
        f"{JOB_DIR}/logs/baseline_run.log",
    conda:
        "../../environment.yml"
    shell:
        "$PY -m prism.baseline --config-json {params.section:q} --out {params.out:q} --force >> {log:q} 2>&1"


rule baseline_graph:
    input:
        rules.baseline_run.output,
    output:
        multiext(f"{JOB_DIR}/baseline/graph/", "events.parquet", "comms.parquet", "groups.parquet", "ranks.parquet"),
    params:
        job=lambda w, input: os.path.dirname(input[0]),
    threads: stage_threads("baseline_graph")
    resources:
        **rule_resources("baseline_graph"),
    log:
        f"{JOB_DIR}/logs/baseline_graph.log",
    conda:
        "../../environment.yml"
    shell:
        "$PY -m prism.graph --job {params.job:q} >> {log:q} 2>&1"


rule baseline_summary:
    input:
        rules.baseline_graph.output,
    output:
        f"{JOB_DIR}/baseline/summary.txt",
    params:
        job=lambda w, output: os.path.dirname(output[0]),
    threads: stage_threads("baseline_summary")
    resources:
        **rule_resources("baseline_summary"),
    log:
        f"{JOB_DIR}/logs/baseline_summary.log",
    conda:
        "../../environment.yml"
    shell:
        "$PY -m prism.summary --job {params.job:q} >> {log:q} 2>&1"
