#!/usr/bin/env bash
# The differential fuzzer of pcc's whole compile pipeline: random models
# (MLP, transformer and convolutional building blocks with odd, tiny and
# size-1 dimensions) and random plans (tp, pp with schedules and chunks, dp,
# ZeRO 0-3, sp, micro-batches, recompute, buckets), for inference and
# training, each compiled by pcc, run by pcc-run on CPU ranks over MPI and
# compared with its one-device run (scripts/fuzz_plans.py).
#
#   scripts/fuzz-plans.sh [SECONDS] [SEED]      # default 600 s, seed 1
#   PCC_SANITIZE=1 scripts/fuzz-plans.sh 600    # pcc and pcc-run under
#                                               # ASan + UBSan (build-asan)
#
# Sets up and builds first (scripts/setup.sh). Prints progress, then the
# pairs run, matches, clear refusals by kind and findings; each finding is
# shrunk and saved (model.onnxtxt, case.json) under the work directory,
# ready to be committed as a regression case in test/Fuzz/Inputs/plans.
# Exits 1 when there was a finding. The run tests a snapshot of the tools,
# the runtime's headers and its libraries ($work/snapshot), so rebuilding
# the tree while it runs changes nothing it tests.
#
# Environment:
#   PCC_FUZZ_PLANS_WORK  work directory (default $build/fuzz-plans/seed-SEED)
#   PCC_FUZZ_PLANS_JOBS  pairs run at once (default: the CPU count)
#   PCC_FUZZ_PLANS_ARGS  more fuzz_plans.py options (--no-shrink, --keep)
set -uo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${PCC_BUILD_DIR:-$root/build}"
seconds="${1:-600}"
seed="${2:-1}"
# shellcheck source=scripts/sanitize-env.sh
. "$root/scripts/sanitize-env.sh"
"$root/scripts/setup.sh" || exit 1

work="${PCC_FUZZ_PLANS_WORK:-$build/fuzz-plans/seed-$seed}"
mkdir -p "$work"
echo "fuzz-plans: $seconds s, seed $seed, tools in $build/bin, work in $work"
# shellcheck disable=SC2086
exec /usr/bin/python3 "$root/scripts/fuzz_plans.py" --bin "$build/bin" \
  --snapshot "$work/snapshot" --seconds "$seconds" --seed "$seed" \
  --jobs "${PCC_FUZZ_PLANS_JOBS:-$(nproc)}" --work "$work" \
  --log "$work/pairs.jsonl" ${PCC_FUZZ_PLANS_ARGS:-}
