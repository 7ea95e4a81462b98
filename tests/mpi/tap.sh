# tests/mpi/tap.sh: what the recipe-driving mpi scripts share (sourced):
# TAP lines, bounded runs and the losses a metrics file logged.
#   ok/not_ok TEXT      "ok - TEXT (TAG)" / "not ok - TEXT (TAG)" (TAG: $TAP_TAG, when set)
#   comment TEXT        TEXT's last 40 lines as TAP comments
#   run COMMAND...      its output in $out, its status in $rc (bounded: 120 s)
#   losses FILE A B     "step loss" of steps A..B of a metrics JSONL file, as written

ok() { echo "ok - $*${TAP_TAG:+ ($TAP_TAG)}"; }
not_ok() { echo "not ok - $*${TAP_TAG:+ ($TAP_TAG)}"; }
comment() { sed 's/^/#   /' <<<"$1" | tail -n 40; }
run() {
  out=$(timeout -k 5 120 "$@" 2>&1)
  rc=$?
}
losses() {
  grep '"type":"train"' "$1" | sed -E 's/.*"loss":([^,}]*).*"step":([0-9]+).*/\2 \1/' |
    awk -v a="$2" -v b="$3" '$1 >= a && $1 <= b'
}
