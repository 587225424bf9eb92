#!/usr/bin/env bash
# Run as it ran (paths under /tmp: the data of torchtitan_cpu.sh, torchtitan's tokenizer, /tmp/fw_revert made by
# cp -r prism /tmp/fw_revert/ and replacing the body of prism/runtime/semantics.py:write by dst.copy_(src)).
# Log: docs/results/frameworks/torchtitan_cpu_w4_tp_sac.txt
REPO=/work/wt/frameworks; WORK=/tmp/ttwork4; mkdir -p $WORK
export HF_DATASETS_OFFLINE=1
TT=($REPO/examples/torchtitan/cpu_train.py --module llama3 --config llama3_debugmodel --training.steps 3 --training.seq_len 128
  --training.local_batch_size 2 --dataloader.dataset_path /tmp/ttwork/data --hf_assets_path /tmp/ttassets/tests/assets/tokenizer
  --checkpoint.no-enable --validator.no-enable --parallelism.spmd_backend partial_dtensor --debug.seed 42
  --parallelism.tensor_parallel_degree 2 --dump_folder $WORK/dump)
cd $WORK
t0=$(date +%s); $REPO/.venv/bin/prism launch --nproc 4 --mode capture --devices 2 --out $WORK/job/capture --force "${TT[@]}" > $WORK/capture.log 2>&1; echo "capture exit $? $(( $(date +%s) - t0 )) s"
$REPO/.venv/bin/prism graph --job $WORK/job --raw $WORK/job/capture/raw --out $WORK/job/graph 2>&1 | tail -1
$REPO/.venv/bin/prism sql --job $WORK/job "SELECT rank, iterations, iteration_rule FROM ranks ORDER BY rank"
$REPO/.venv/bin/prism sql --job $WORK/job "SELECT op, count(*) FROM events WHERE kind = 'marker' AND rank = 0 GROUP BY ALL ORDER BY ALL"
t0=$(date +%s); $REPO/.venv/bin/prism launch --nproc 4 --mode emulate --capture $WORK/job/capture --sandbox 1 --out $WORK/job/emu --force "${TT[@]}" > $WORK/emu.log 2>&1; echo "emulate (fix) exit $? $(( $(date +%s) - t0 )) s" &
t1=$(date +%s); PYTHONPATH=/tmp/fw_revert $REPO/.venv/bin/python -m prism.cli launch --nproc 4 --mode emulate --capture $WORK/job/capture --sandbox 1 --out $WORK/job/emu_revert --force "${TT[@]}" > $WORK/emu_revert.log 2>&1; echo "emulate (reverted writes) exit $? $(( $(date +%s) - t1 )) s"
wait
for f in capture emu emu_revert; do echo "== $f"; sed 's/\x1b\[[0-9;]*m//g' $WORK/$f.log | grep -o "step: *[0-9]* *loss: *[0-9.]*" | sort -u; grep -m2 "mutated\|Error:" $WORK/$f.log | cut -c1-200; done
