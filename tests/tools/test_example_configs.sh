#!/bin/sh
# The example configurations say what they are: each examples/configs/NAME.yaml
# begins "# A <N>M-parameter model (<count> parameters...", NAME is "<N>m",
# <count> is what llmt-plan --config reports, and <N> is <count> in millions,
# rounded. The full example of docs/config.md is the file it names.
# Usage: test_example_configs.sh PATH_TO_LLMT_PLAN SOURCE_DIR
set -eu
tool=$1
src=$2
tmp=$(mktemp)
trap 'rm -f "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

n=0
for f in "$src"/examples/configs/*.yaml; do
    name=$(basename "$f" .yaml)
    head -n 1 "$f" | grep -Eq '^# A [0-9]+M-parameter model \([0-9,]+ parameters' ||
        fail "$name.yaml: the first line is not '# A <N>M-parameter model (<count> parameters': $(head -n 1 "$f")"
    millions=$(head -n 1 "$f" | sed -E 's/^# A ([0-9]+)M-parameter.*/\1/')
    claimed=$(head -n 1 "$f" | sed -E 's/^[^(]*\(([0-9,]+) parameters.*/\1/' | tr -d ,)
    [ "$name" = "${millions}m" ] || fail "$name.yaml describes a ${millions}M model"
    counted=$("$tool" --config "$f" | sed -nE 's/^ *\(([0-9]+) parameters\)$/\1/p')
    [ -n "$counted" ] || fail "$name.yaml: llmt-plan reports no parameter count"
    [ "$claimed" = "$counted" ] || fail "$name.yaml claims $claimed parameters; llmt-plan counts $counted"
    [ $(((counted + 500000) / 1000000)) = "$millions" ] ||
        fail "$name.yaml: $counted parameters are not ${millions}M"
    n=$((n + 1))
done
[ "$n" -gt 0 ] || fail "no configurations in $src/examples/configs"

doc=$src/docs/config.md
named=$(sed -nE 's/^The same file is in `(examples\/configs\/[^`]+)`.*/\1/p' "$doc")
[ -n "$named" ] || fail "docs/config.md names no example file"
sed -n '/^## A full example/,/^```$/p' "$doc" | sed '1,/^```yaml$/d; /^```$/d' > "$tmp"
diff -u "$src/$named" "$tmp" >&2 || fail "docs/config.md's full example differs from $named"
echo "ok: $n example configuration(s) say their parameter count; docs/config.md shows $named"
