# tests/tp_lines.sh - the GPT's "tp N losses ... norms ..." line, as tests/test_gpt_tp.sh and
# tests/test_trainer.sh compare it (sourced, not run).
tpline() { sed -n 's/^tp [0-9]* losses //p' "$1"; } # "L0 L1 L2 norms N0 N1 N2"
tpclose() { # tpclose A B: every number of line A within 1e-5 relative of line B's
    [ -n "$1" ] && [ -n "$2" ] && awk -v a="$1" -v b="$2" 'BEGIN {
        n = split(a, x, " "); m = split(b, y, " "); if (n != m || n < 5) exit 1
        for (i = 1; i <= n; i++) { if (x[i] == "norms") continue
            d = x[i] - y[i]; if (d < 0) d = -d; r = y[i] < 0 ? -y[i] : y[i]; if (d > 1e-5 * r) exit 1 }
        exit 0 }'
}
