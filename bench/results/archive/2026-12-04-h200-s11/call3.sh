#!/usr/bin/env bash
# Session 11, device call 3 (issue 17): why our expert GEMMs trail QuACK's at 120B-n2048. ncu --set full
# on each of leanmoe's six GEMMs alone (leanmoe_bench_gemms of 2f7825a, .carry/s11b), with SASS-level
# warp-stall samples (top instructions) and the stall-reason totals; the same stall totals for
# SonicMoE's six (QuACK 0.4.1, kernel cache .carry/qc).
# Run twice (the carry limit): PART=sonic with .carry/sonicmoe + .carry/qc (installs SonicMoE in /tmp/site, kept
# while the machine stays warm), then without PART with .carry/s11b/leanmoe_bench_gemms.xz.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../../../.."
FINAL="${OUT:-/tmp/leanmoe-out}"; mkdir -p "$FINAL"
W="$(mktemp -d)"; S=.carry/sonicmoe
trap 'tar czf "$FINAL/logs.tar.gz" -C "$W" --exclude="*.ncu-rep" . 2>/dev/null' EXIT
[ -d /tmp/site/sonicmoe ] || { mkdir -p /tmp/site && tar xJf $S/lb.tar.xz -C /tmp/site &&
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $S/*.whl >"$W/install.log" 2>&1; }
[ -d /tmp/quack_cache ] || xz -dc .carry/qc/quack_cache.tar.xz | tar xf - -C /tmp
export PYTHONPATH=/tmp/site:/tmp/site/nvidia_cutlass_dsl/python_packages QUACK_CACHE_DIR=/tmp/quack_cache QUACK_CACHE_AUTOTUNING=1
[ -f .carry/s11b/leanmoe_bench_gemms.xz ] && xz -dc .carry/s11b/leanmoe_bench_gemms.xz > /tmp/bench_gemms && chmod +x /tmp/bench_gemms
# Stall-reason totals of every profiled kernel (raw page), then the top SASS lines by stall samples.
summ() {  # $1 = report
  ncu -i "$1" --page raw --csv 2>/dev/null | python3 -c '
import csv,sys
rows=list(csv.reader(sys.stdin)); h=rows[0]
keep=[j for j,n in enumerate(h) if ("pcsamp_warps_issue_stalled" in n and not n.endswith("not_issued")) or n in ("gpu__time_duration.sum","Kernel Name","sm__throughput.avg.pct_of_peak_sustained_elapsed","sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active","smsp__inst_executed.sum")]
for r in rows[2:]:
    vals=[(h[j],r[j]) for j in keep]
    name=[v for k,v in vals if k=="Kernel Name"][0][:90]
    print("##",name)
    st=[(k.replace("smsp__pcsamp_warps_issue_stalled_",""),float(v.replace(",","") or 0)) for k,v in vals if "pcsamp" in k]
    tot=sum(v for k,v in st) or 1
    for k,v in vals:
        if "pcsamp" not in k and k!="Kernel Name": print("  ",k,v)
    for k,v in sorted(st,key=lambda x:-x[1])[:12]: print("   stall %-28s %5.1f%%" % (k,100*v/tot))
'
}
sass_top() {  # $1 = report
  ncu -i "$1" --page source --csv --print-source sass 2>/dev/null | python3 -c '
import csv,sys
rows=list(csv.reader(sys.stdin))
h=[i for i,r in enumerate(rows) if "Source" in r][0]; hdr=rows[h]; R=rows[h+1:]
ci=hdr.index("Source"); si=[j for j,n in enumerate(hdr) if n.startswith("Warp Stall Sampling (All")][0]
ai=hdr.index("Address") if "Address" in hdr else 0
tot=sum(float(r[si] or 0) for r in R if len(r)>si) or 1
print("columns:", [n for n in hdr][:40])
for r in sorted([r for r in R if len(r)>si], key=lambda r:-float(r[si] or 0))[:30]:
    print("%6.2f%%  %s  %s" % (100*float(r[si] or 0)/tot, r[ai], r[ci][:110]))
'
}
[ -x /tmp/bench_gemms ] && [ "${PART:-}" != sonic ] && for k in up dh dw2 dw1 dx down; do
  case $k in dx|down) re='regex:device_kernel';; *) re='regex:gather_grouped_gemm';; esac
  echo "== ours $k (t=${SECONDS})"
  timeout 90 ncu --set full --import-source no -f -o "$W/r_$k" -k "$re" -c 1 /tmp/bench_gemms --shape 120B-n2048 \
    --gemms $k --iters 1 --warmup 1 > "$W/ncu_$k.log" 2>&1; echo "rc=$?"
  summ "$W/r_$k.ncu-rep" > "$W/stalls_ours_$k.txt"; sass_top "$W/r_$k.ncu-rep" > "$W/sass_ours_$k.txt"
  head -30 "$W/stalls_ours_$k.txt"
done
[ "${PART:-}" = sonic ] && { echo "== sonic (t=${SECONDS})"; mkdir -p "$W/o"
CONFIGS=120B-n2048 ITERS=1 WARM=0 ROUTER=topk_then_softmax OUT="$W/o" timeout 200 \
  ncu --set full --import-source no -f -o "$W/r_sonic" -k 'regex:quackgemm' -c 6 python3 $S/sonic_bench.py > "$W/ncu_sonic.log" 2>&1
echo "rc=$?"; summ "$W/r_sonic.ncu-rep" > "$W/stalls_sonic.txt"; cat "$W/stalls_sonic.txt" | head -120; }
(cd "$W" && tar czf "$FINAL/profiles.tgz" stalls_*.txt sass_*.txt)
echo "done (t=${SECONDS})"
