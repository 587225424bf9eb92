# The real run of every rank (ground truth), its graph and its summary. `baseline.run: auto` is decided by the
# baseline_decision checkpoint, on the machine the baseline run would get (on SLURM: a node with W cores), never on
# the host that submits the jobs; its baseline-decision.json (beside baseline/, which the baseline run clears) says
# why a baseline is missing (the report quotes it).


checkpoint baseline_decision:
    output:
        f"{JOB_DIR}/baseline-decision.json",
    params:
        section=section("baseline"),
    threads: stage_threads("baseline_decision")
    resources:
        **rule_resources("baseline_decision"),
    log:
        f"{JOB_DIR}/logs/baseline_decision.log",
    conda:
        "../envs/runtime.yaml"
    shell:
        "$PY -m prism.baseline --config-json {params.section:q} --decide {output:q} >> {log:q} 2>&1"


rule baseline_run:  # runs alone: its timings must not share the machine with another stage
    input:
        f"{JOB_DIR}/baseline-decision.json",
    output:
        directory(f"{JOB_DIR}/baseline/raw"),
    params:
        section=section("baseline"),
        out=in_job("baseline"),
    threads: stage_threads("baseline_run")
    resources:
        **rule_resources("baseline_run"),
    log:
        f"{JOB_DIR}/logs/baseline_run.log",
    conda:
        "../envs/runtime.yaml"
    shell:
        "$PY -m prism.baseline --config-json {params.section:q} --out {params.out:q} --force >> {log:q} 2>&1"


rule baseline_graph:
    input:
        rules.baseline_run.output,
    output:
        multiext(f"{JOB_DIR}/baseline/graph/", "events.parquet", "comms.parquet", "groups.parquet", "ranks.parquet"),
    params:
        job=in_job("baseline"),
    threads: stage_threads("baseline_graph")
    resources:
        **rule_resources("baseline_graph"),
    log:
        f"{JOB_DIR}/logs/baseline_graph.log",
    conda:
        "../envs/analysis.yaml"
    shell:
        "$PY -m prism.graph --job {params.job:q} >> {log:q} 2>&1"


rule baseline_summary:
    input:
        rules.baseline_graph.output,
    output:
        f"{JOB_DIR}/baseline/summary.txt",
    params:
        job=in_job("baseline"),
    threads: stage_threads("baseline_summary")
    resources:
        **rule_resources("baseline_summary"),
    log:
        f"{JOB_DIR}/logs/baseline_summary.log",
    conda:
        "../envs/analysis.yaml"
    shell:
        "$PY -m prism.summary --job {params.job:q} >> {log:q} 2>&1"
