"""Launch scripts in slime's style (bash arrays, `ray job submit ... -- python3 train.py`), written for slick's tests
with the flag sets of slime's own examples (THUDM/slime 624b824a): GRPO (scripts/run-qwen3-4B.sh), SFT
(scripts/run-qwen3-4B-base-sft.sh), multi-turn (examples/retool/retool_qwen3_4b_rl.sh) and fully async
(examples/fully_async/run-qwen2.5-0.5B-fully_async.sh). Sizes are for slime's models; {MODEL}, {DATA}, {CHATS},
{SAVE} and {PLUGIN} are placeholders the tests fill."""

GRPO = r"""#!/bin/bash
set -ex
# a GRPO run of a 4B model
NUM_GPUS=${NUM_GPUS:-8}
source "{MODEL_ARGS}"   # not read by slime-check

CKPT=(
  --hf-checkpoint {MODEL}
  --load {SAVE} --save {SAVE}
  --save-interval 20
)
ROLLOUT=(
  --prompt-data {DATA}
  --input-key prompt --label-key label
  --apply-chat-template --rollout-shuffle
  --rm-type deepscaler
  --num-rollout 3000 --rollout-batch-size 32 --n-samples-per-prompt 8
  --rollout-max-response-len 8192 --rollout-temperature 1
  --global-batch-size 256 --balance-data
)
OPT=( --optimizer adam --lr 1e-6 --lr-decay-style constant --weight-decay 0.1 --adam-beta1 0.9 --adam-beta2 0.98 )
GRPO=( --advantage-estimator grpo --use-kl-loss --kl-loss-coef 0.00 --kl-loss-type low_var_kl
       --entropy-coef 0.00 --eps-clip 0.2 --eps-clip-high 0.28 )
PERF=( --tensor-model-parallel-size 1 --sequence-parallel --pipeline-model-parallel-size 1
       --context-parallel-size 1 --expert-model-parallel-size 1 --expert-tensor-parallel-size 1
       --recompute-granularity full --recompute-method uniform --recompute-num-layers 1
       --use-dynamic-batch-size --max-tokens-per-gpu 9216 )
EVAL=( --eval-interval 20 --eval-prompt-data aime {DATA} --n-samples-per-eval-prompt 16
       --eval-max-response-len 16384 --eval-top-p 1 )
MISC=( --attention-dropout 0.0 --hidden-dropout 0.0 --accumulate-allreduce-grads-in-fp32
       --attention-softmax-in-fp32 --attention-backend flash )

ray job submit --address="http://127.0.0.1:8265" \
   --runtime-env-json='{"env_vars": {"PYTHONPATH": "/root/Megatron-LM/"}}' \
   -- python3 train.py \
   --actor-num-nodes 1 --actor-num-gpus-per-node ${NUM_GPUS} --colocate \
   ${CKPT[@]} ${ROLLOUT[@]} ${OPT[@]} ${GRPO[@]} ${PERF[@]} ${EVAL[@]} \
   --sglang-mem-fraction-static 0.7 \
   ${MISC[@]}
"""

SFT = r"""#!/bin/bash
# supervised fine-tuning on chats, as slime runs it (through train_async.py)
SFT_ARGS=(
   --rollout-function-path slime.rollout.sft_rollout.generate_rollout
   --prompt-data {CHATS}
   --input-key messages
   --rollout-shuffle
   --num-epoch 3
   --rollout-batch-size 128
   --global-batch-size 128
   --loss-type sft_loss
   --calculate-per-token-loss
   --disable-compute-advantages-and-returns
   --debug-train-only
)
OPTIMIZER_ARGS=(
   --optimizer adam --lr 1e-5 --lr-decay-style cosine --min-lr 1e-6 --lr-warmup-fraction 0.1
   --weight-decay 0.1 --adam-beta1 0.9 --adam-beta2 0.95
)
python3 train_async.py --actor-num-nodes 1 --actor-num-gpus-per-node 8 \
   --hf-checkpoint {MODEL} --save {SAVE} --save-interval 1000 \
   "${SFT_ARGS[@]}" "${OPTIMIZER_ARGS[@]}" \
   --use-dynamic-batch-size --max-tokens-per-gpu 9216 \
   --attention-dropout 0.0 --hidden-dropout 0.0 --accumulate-allreduce-grads-in-fp32 \
   --attention-softmax-in-fp32 --attention-backend flash 2>&1 | tee sft.log
"""

MULTI_TURN = r"""#!/bin/bash
# a tool-using multi-turn rollout from a custom generate function
WANDB_KEY=${WANDB_KEY:-}
ROLLOUT_ARGS=(
   --prompt-data {DATA} --input-key prompt --label-key label --apply-chat-template --rollout-shuffle
   --reward-key score
   --num-rollout 3000 --rollout-batch-size 32 --n-samples-per-prompt 8
   --rollout-max-response-len 8192 --rollout-temperature 1 --global-batch-size 256 --balance-data
)
GRPO_ARGS=( --advantage-estimator grpo --use-kl-loss --kl-loss-coef 0.00 --kl-loss-type low_var_kl
            --entropy-coef 0.00 --eps-clip 0.2 --eps-clip-high 0.28 )
WANDB_ARGS=( --use-wandb --wandb-project slime-dapo --wandb-group multi-turn --wandb-key ${WANDB_KEY} )
CUSTOM_ARGS=( --custom-generate-function-path {PLUGIN}.generate --custom-rm-path {PLUGIN}.reward_func )
ray job submit --address="http://127.0.0.1:8265" -- python3 train.py --actor-num-nodes 1 \
   --actor-num-gpus-per-node 4 --colocate --hf-checkpoint {MODEL} \
   ${ROLLOUT_ARGS[@]} ${GRPO_ARGS[@]} ${WANDB_ARGS[@]} ${CUSTOM_ARGS[@]} \
   --optimizer adam --lr 1e-6 --lr-decay-style constant --weight-decay 0.1 --adam-beta1 0.9 --adam-beta2 0.98
"""

ASYNC = r"""#!/bin/bash
ACTOR_GPUS=${ACTOR_GPUS:-1}
ROLLOUT_GPUS=${ROLLOUT_GPUS:-$((8 - ACTOR_GPUS))}
ROLLOUT_ARGS=(
   # the one change that makes the run fully asynchronous (a comment with (parentheses))
   --rollout-function-path slime.rollout.fully_async_rollout.generate_rollout_fully_async
   --prompt-data "{DATA}" --input-key prompt --label-key label --apply-chat-template --rollout-shuffle
   --rm-type deepscaler --num-rollout 3 --rollout-batch-size 8 --n-samples-per-prompt 4
   --rollout-max-response-len 1024 --rollout-temperature 1 --global-batch-size 32 --balance-data
)
python3 train_async.py --actor-num-nodes 1 --actor-num-gpus-per-node "${ACTOR_GPUS}" \
   --rollout-num-gpus "${ROLLOUT_GPUS}" --hf-checkpoint {MODEL} --save {SAVE} --save-interval 9999 \
   "${ROLLOUT_ARGS[@]}" --use-dynamic-batch-size --max-tokens-per-gpu 4096 \
   --advantage-estimator grpo --use-kl-loss --kl-loss-coef 0.00 --kl-loss-type low_var_kl --entropy-coef 0.00 \
   --eps-clip 0.2 --eps-clip-high 0.28 --optimizer adam --lr 1e-6 --lr-decay-style constant --weight-decay 0.1 \
   --adam-beta1 0.9 --adam-beta2 0.98 --rollout-num-gpus-per-engine 1 --sglang-mem-fraction-static 0.55
"""

SCRIPTS = {"grpo": GRPO, "sft": SFT, "multi-turn": MULTI_TURN, "async": ASYNC}
