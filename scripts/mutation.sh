#!/usr/bin/env bash
# Mutation testing of the core with mutmut 3 (not in CI; hours on 2 cores). docs/testing.md
# records the scores and explains every surviving mutant kept.
#
#   bash scripts/mutation.sh                 # every module group below, permission last
#   bash scripts/mutation.sh batch loss      # some groups
#   MUTATION_CHILDREN=1 bash scripts/mutation.sh counts
#   MUTATION_RETEST=1 bash scripts/mutation.sh batch   # retest only last run's survivors
#   bash scripts/mutation.sh planted [NAME...]           # the planted mutants in tests/mutants/
#
# "planted": each tests/mutants/*.patch (a small realistic bug) applied alone to a scratch copy
# under .cache/planted/, its listed tests run, and the tests that fail reported per mutant
# (scripts/mutation_planted.py; docs/testing.md keeps the table). No mutmut involved.
#
# CLI-level test files (adversarial/test_hostile.py, test_cli*) are left out of the selections:
# they are slow per mutant, their subprocesses import the unmutated package, and the core's
# messages are checked whole by the reference tests.
# Each group runs in its own scratch copy, .cache/mutation/<group>/ (src/, tests/, docs/,
# examples/, README.md and pyproject.toml, prepared by scripts/mutation_prepare.py), mutating only its modules and
# selecting tests only from its test files (the kernels group under the python kernels,
# EXACTPACK_KERNELS=python: mutating a Python kernel leaves its C twin as it was), with the
# derandomized "mutation" hypothesis profile. mutmut keeps its results there, so a rerun only retests
# mutants of changed functions. Summaries: .cache/mutation/<group>/summary.json and
# .cache/mutation/summary.txt; survivors: .cache/mutation/<group>/survivors.txt.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
if [ "${1:-}" = planted ]; then
    shift
    exec nice -n 10 .venv/bin/python scripts/mutation_planted.py "$@"
fi

# group | modules under src/exactpack (comma-separated) | test files
GROUPS_TABLE="
examples|core/examples.py|test_examples.py test_reference_examples.py test_reference_store.py test_batch.py test_hostile.py
loss|core/loss.py|test_loss.py test_reference_loss.py test_reference_loss_rules.py
training_loss|training/global_loss.py|test_training_loss.py test_reference_loss.py test_reference_loss_rules.py
batch|core/batch.py|test_batch.py test_reference_permission.py test_reference_budget.py
kernels|core/engine.py,core/stream_packer.py|test_policies.py test_stream_packer.py test_reference_stream.py
policies|core/policies.py|test_policies.py test_reference_plan.py test_stream_packer.py test_reference_stream.py
config|core/config.py|test_reference_budget.py test_batch.py
budget|core/arith.py|test_reference_budget.py test_batch.py
plan|core/plan.py|test_reference_plan.py test_policies.py
checks|core/checks.py|test_reference_plan.py test_policies.py test_stream_packer.py
compact|core/compact.py|test_reference_compact.py test_store.py test_reference_store.py
counts|core/counts.py|test_counts.py test_reference_core.py
binding|core/binding.py|test_reference_core.py test_examples.py test_batch.py
permission|core/permission.py|test_permission.py test_reference_permission.py
"

if [ ! -x .venv/bin/python ]; then
    bash scripts/setup-venv.sh dev
fi
.venv/bin/python -c "import mutmut" 2>/dev/null || .venv/bin/python -m pip install -q "mutmut==3.8.1"

wanted=("$@")
children="${MUTATION_CHILDREN:-2}"
summary="$root/.cache/mutation/summary.txt"
mkdir -p "$root/.cache/mutation"

while IFS='|' read -r group modules tests; do
    [ -n "$group" ] || continue
    if [ ${#wanted[@]} -gt 0 ] && [[ ! " ${wanted[*]} " =~ " $group " ]]; then
        continue
    fi
    work="$root/.cache/mutation/$group"
    mkdir -p "$work"
    # Fresh sources with their mtimes (mutmut retests the functions that changed).
    rm -rf "$work/src" "$work/tests" "$work/docs" "$work/examples"
    cp -a src tests docs examples README.md "$work/"
    cp -p pyproject.toml "$work/pyproject.toml"
    selected=()
    for t in $tests; do  # a bare file name, found in whichever tests/ folder holds it
        for f in tests/*/"$t"; do [ -f "$f" ] && selected+=("$f"); done
    done
    .venv/bin/python scripts/mutation_prepare.py "$work" "$modules" "${selected[@]}"
    echo "== $group: mutating $modules with ${selected[*]}"
    (
        cd "$work"
        export HYPOTHESIS_PROFILE=mutation
        # Mutated kernels are Python (their C twins stay as built): run them as Python.
        # Other groups keep the C kernels, so their native-only branches are reached too.
        case "$modules" in
            *_kernels*) export EXACTPACK_KERNELS=python ;;
            *) unset EXACTPACK_KERNELS ;;
        esac
        export MPLCONFIGDIR="$root/.cache/matplotlib" TORCHINDUCTOR_CACHE_DIR="$root/.cache/inductor"
        export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
        # MUTATION_RETEST=1: only the mutants the last run left alive, against the tests as
        # they are now (mutmut keeps earlier verdicts; new tests alone do not revisit them).
        names=()
        if [ "${MUTATION_RETEST:-0}" = 1 ] && [ -f results.txt ]; then
            mapfile -t names < <(awk '$2 == "survived" || $2 == "no" {print $1}' results.txt)
            [ ${#names[@]} -gt 0 ] || names=(none-left)
        fi
        [ "${names[*]:-}" = none-left ] ||
        nice -n 10 "$root/.venv/bin/mutmut" run --max-children "$children" "${names[@]}" >run.log 2>&1 || {
            echo "mutmut failed for $group; see $work/run.log" >&2
            tail -20 run.log >&2
            exit 1
        }
        "$root/.venv/bin/mutmut" export-cicd-stats >/dev/null
        cp mutants/mutmut-cicd-stats.json summary.json
        # Every mutant not killed, with its diff (what docs/testing.md explains).
        "$root/.venv/bin/mutmut" results 2>/dev/null | sed -n 's/^ *\([^:]*\): \(.*\)$/\1 \2/p' >results.txt || true
        : >survivors.txt
        while read -r name status; do
            { echo "## $name ($status)"; "$root/.venv/bin/mutmut" show "$name" 2>/dev/null | tail -n +2; echo; } >>survivors.txt
        done <results.txt
    )
    "$root/.venv/bin/python" - "$group" "$work/summary.json" "$summary" <<'EOF'
import json, sys
group, path, out = sys.argv[1:]
s = json.load(open(path))
killed = s["killed"] + s["timeout"]
tested = s["total"] - s["skipped"]
score = 100.0 * killed / tested if tested else 100.0
line = (
    f"{group:14s} mutants {tested:5d} killed {killed:5d} survived {s['survived']:4d}"
    f" no-tests {s['no_tests']:3d} suspicious {s['suspicious']:3d} score {score:5.1f}%"
)
print(line)
lines = [l for l in (open(out).read().splitlines() if __import__("os").path.exists(out) else []) if not l.startswith(f"{group} ")]
open(out, "w").write("\n".join(sorted(lines + [line])) + "\n")
EOF
done <<<"$GROUPS_TABLE"
