#!/usr/bin/env bash
# Readies a device call that compares kgen trees on one machine: the JSON-schema wheels the device image lacks
# (.whl/), and each named git revision's kgen, templates, specs and pyproject.toml in .ab3/trees/NAME, with its
# short commit in .ab3/trees/NAME/REVISION. Both folders are git-ignored; carry them:
#
#   bash tools/device_trees.sh old=main ovl=wip/overlap-epilogue   # then run(..., carry=[".whl", ".ab3/trees"])
#
# On the device, tools/device_lib.sh runs builds, tests, A/Bs and records with one tree's kgen on the path.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! compgen -G ".whl/*.whl" > /dev/null; then
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl \
        jsonschema jsonschema-specifications referencing rpds-py attrs
fi
grep -qx "/.ab3/" .git/info/exclude 2>/dev/null || echo "/.ab3/" >> .git/info/exclude
for named in "$@"; do
    name=${named%%=*} revision=${named#*=}
    rm -rf ".ab3/trees/$name" && mkdir -p ".ab3/trees/$name"
    git archive "$revision" kgen templates specs pyproject.toml | tar -x -C ".ab3/trees/$name"
    git rev-parse --short "$revision" > ".ab3/trees/$name/REVISION"
    echo "$name = $revision ($(cat ".ab3/trees/$name/REVISION"))"
done
du -sh .whl .ab3/trees
