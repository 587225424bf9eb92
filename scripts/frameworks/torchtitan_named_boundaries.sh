#!/usr/bin/env bash
# Named boundaries on torchtitan (W=2 FSDP2, real mode), as it ran (data and tokenizer paths of torchtitan_cpu.sh under /tmp).
# Log: docs/results/frameworks/torchtitan_named_boundaries.txt
REPO=/work/wt/frameworks; WORK=/tmp/ttnamed; mkdir -p $WORK; cd $WORK; export HF_DATASETS_OFFLINE=1
TT=($REPO/examples/torchtitan/cpu_train.py --module llama3 --config llama3_debugmodel --training.steps 3 --training.seq_len 128
  --training.local_batch_size 2 --dataloader.dataset_path /tmp/ttwork/data --hf_assets_path /tmp/ttassets/tests/assets/tokenizer
  --checkpoint.no-enable --validator.no-enable --parallelism.spmd_backend partial_dtensor --debug.seed 42 --dump_folder $WORK/dump)
$REPO/.venv/bin/prism launch --nproc 2 --mode real --out $WORK/job --force --iteration-fn torchtitan.trainer:Trainer.train_step \
  --microbatch-fn torchtitan.trainer:Trainer.forward_backward_step "${TT[@]}" > $WORK/real.log 2>&1; echo "real exit $?"
$REPO/.venv/bin/prism graph --job $WORK/job 2>&1 | tail -1
$REPO/.venv/bin/prism sql --job $WORK/job "SELECT rank, iterations, iteration_rule, microbatch_rule FROM ranks ORDER BY rank"
$REPO/.venv/bin/prism sql --job $WORK/job "SELECT op, count(*) FROM events WHERE kind = 'marker' AND rank = 0 GROUP BY ALL ORDER BY ALL"
