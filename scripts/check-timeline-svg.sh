#!/usr/bin/env bash
# Renders a timeline SVG (from `gpumem plot` or the ignored test in
# src/report/timeline_svg.rs) to a PNG with headless Chromium, so the chart can be checked by
# eye without a desktop: a browser is the reference renderer for the SVG that plotters writes.
#
# Usage: scripts/check-timeline-svg.sh SVG PNG
set -euo pipefail

if [ "$#" -ne 2 ]; then
    echo "usage: $0 SVG PNG" >&2
    exit 2
fi
svg=$1
png=$2
if [ ! -f "$svg" ]; then
    echo "$0: no such SVG: $svg" >&2
    exit 1
fi

if [ ! -x /usr/bin/chromium ]; then
    echo "installing chromium (apt) ..." >&2
    apt-get update
    DEBIAN_FRONTEND=noninteractive apt-get install -y chromium
fi

# Chromium wants absolute paths: file:// for the input, and it writes the screenshot
# relative to its own working directory otherwise.
abs_svg=$(realpath "$svg")
abs_png=$(realpath -m "$png")
mkdir -p "$(dirname "$abs_png")"
profile=$(mktemp -d)
trap 'rm -rf "$profile"' EXIT
rm -f "$abs_png"

# The chart is 1200x600; the window matches it so the screenshot is the whole chart.
# The network and update switches keep a sandboxed machine from waiting on requests that
# cannot succeed.
/usr/bin/chromium --headless --no-sandbox --disable-gpu --disable-quic --no-first-run \
    --disable-background-networking --disable-component-update --disable-sync \
    --user-data-dir="$profile" --hide-scrollbars \
    --screenshot="$abs_png" --window-size=1200,600 "file://$abs_svg" 2>"$profile/chromium.log" || {
    cat "$profile/chromium.log" >&2
    exit 1
}

if [ ! -s "$abs_png" ]; then
    echo "$0: chromium wrote no screenshot; its log:" >&2
    cat "$profile/chromium.log" >&2
    exit 1
fi
echo "$abs_png"
