#!/usr/bin/env bash
# Session 44: s43's one call with the ping-pong gather kernel for up and dH put in front of it
# (pingpong.patch: 128 x 128 tiles, each consumer warpgroup its own, one's epilogue under the other's
# MMAs; QuACK's autotuner picks that schedule for dH at n <= 512, where our cooperative dH is
# 8-18% behind its). The binaries are prepare.sh's: main, and "all" = main + s42's chunk.patch,
# fp8alt.patch, fwdgroups.patch + pingpong.patch (ping-pong only where a configuration names it).
# Most decisive first; the cap cuts from the end:
# 1. the dev benches (seconds): FP8 promotion with the warpgroups' wgmma groups alternating; a tile's
#    epilogue under the next tile's wgmmas (two accumulator sets) against the cooperative order;
# 2. correctness: the layer with ping-pong up and dH bitwise against the cooperative kernels, the
#    grouped forward against the ordinary one, down / dx from the chunked counter against the static
#    kernel; up and dH output digests, ping-pong against cooperative, on five grid rows;
# 3. up and dH, cooperative against ping-pong, leanmoe_bench_gemms, 2 rounds (the --config order
#    reversed in the second) on the small rows and two large ones;
# 4. the layer, graph replays at the steady state, 2 rounds, variants rotated: off, the grouped
#    forward (--fwd-overlap 4:16), ping-pong dH (ping-pong up is in step 3 only: without clusters its
#    128 x 128 k-tile asks ~64 B per cycle of the SM's loads, against ~50 that dW's loads reach);
# 5. FP8 up / dH, main against the alternation, ncu at base clocks;
# 6. down / dx static against the chunks of 4 on the small rows, ncu;
# 7. where dH's and up's time goes, cooperative and ping-pong: ncu's issue, stall and memory sections
#    (the cooperative dH at 7B-n256 is 0.45 of its floor; docs/kernels.md "The bars against the
#    layer's floor" has the estimate these test);
# 8. every compiled configuration (ping-pong among them), sanitizers on the ping-pong layer test and
#    the grouped forward.
# Carry [".carry/s44", ".carry/s44_layer/leanmoe_all.xz"], bench/results/archive moved out. BUDGET=540;
# FROM=N starts at step N (a second call for what the cap cut from the first).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
source scripts/device_call.sh
unpack fp8p=.carry/s44/fp8p.xz eob=.carry/s44/eob.xz c1=.carry/s44/bg_c1.xz all=.carry/s44/bg_all.xz \
  bg=.carry/s44/bg_all.xz gt=.carry/s44/gt_all.xz leanmoe=.carry/s44_layer/leanmoe_all.xz
header .carry/s44/commit
CU=gather:coop:128x256:s4:warp:c1 PU=gather:pingpong:128x128:s6:warp:c1
CD=gather:coop:128x256:s4:warp:c2 PD=gather:pingpong:128x128:s6:warp:c2
SMALL=1.4B-n256,1.4B-n512,7B-n256,7B-n1024
P=cutlass:pingpong:128x192:auto
declare -A V
V[off]=""
V[g4s16]="--fwd-overlap 4:16"
V[ppdh]="--gemm-config dh=$PD"
if step 1 "dev benches"; then
  dev_bench fp8_promotion fp8p 20000
  dev_bench epilogue_overlap eob 2000
fi
if step 2 "correctness"; then
  gpu_tests 'LayerGemmConfigs.PingPongKeepsOutputsBitwise:ForwardOverlap.*:ExpertGemms.CutlassDynamicTilesMatchStatic'
  digest coop all --shape $SMALL,olmoe-1b-7b --layout hf --gemms up,dh --config up=$CU,dh=$CD
  digest pingpong all --shape $SMALL,olmoe-1b-7b --layout hf --gemms up,dh --config up=$PU,dh=$PD
fi
if step 3 "up and dH, cooperative against ping-pong"; then
  gemm_rounds 2 updh --shape $SMALL,olmoe-1b-7b,120B-n2048 --layout hf --gemms up,dh \
    --config up=$CU,up=$PU,dh=$CD,dh=$PD
fi
if step 4 "the layer"; then layer_rounds 2 7B-n256,1.4B-n256 off g4s16 ppdh; fi
if step 5 "FP8 alternation, ncu"; then
  for r in 120B-n2048 7B-n256; do
    for g in up dh; do
      for b in c1 all; do ncu_ms "fp8_${r}_${g}_$b" $b --shape $r --layout hf --gemms $g --precision fp8; done
    done
  done
fi
if step 6 "down / dx chunks, ncu"; then
  for r in 7B-n256 1.4B-n256; do
    for g in down dx; do
      NCU_KERNEL=GemmUniversal ncu_ms "${r}_${g}_static" c1 --shape $r --layout hf --gemms $g
      NCU_KERNEL=GemmUniversal ncu_ms "${r}_${g}_dyn1x2_c4" all --shape $r --layout hf --gemms $g --config $g=$P:tma:c1x2:dyn
    done
    NCU_KERNEL=GemmUniversal ncu_ms "${r}_down_dyn64_c4" all --shape $r --layout hf --gemms down --config down=$P:tma64:c1x2:dyn
  done
fi
if step 7 "where up's and dH's time goes, ncu sections"; then
  for c in $CD $PD; do
    ncu_sections "7B-n256_dh_$(echo $c | cut -d: -f2)" all --shape 7B-n256 --layout hf --gemms dh --config dh=$c
  done
  for c in $CU $PU; do
    ncu_sections "1.4B-n256_up_$(echo $c | cut -d: -f2)" all --shape 1.4B-n256 --layout hf --gemms up --config up=$c
  done
fi
if step 8 "every compiled configuration, sanitizers"; then
  gpu_tests 'ExpertGemms.EveryCompiledConfig' 'LayerGemmConfigs.PingPongKeepsOutputsBitwise:ForwardOverlap.TopKBiasesAndLayoutsBitwise'
fi
say "done t=$SECONDS"
