// For the code points listed in argv[2] (PCRE2-unassigned), asks HF tokenizers' own regex
// engine (Oniguruma) which of them are in \p{L}, \p{M}, \p{N}, \p{P}, \p{S}, \p{Z}, and
// prints {"L": [[first, last], ...], ...}. Used by gen_additions.sh.
'use strict';
const path = require('path');
const os = require('os');
const { Tokenizer } = require(path.join(__dirname, '../../tests/tokenizer/node_modules/@anush008/tokenizers'));
const fs = require('fs');
const cps = fs.readFileSync(process.argv[2], 'utf8').trim().split('\n').map((h) => parseInt(h, 16));
const result = {};
const tokenizerFile = path.join(os.tmpdir(), `onig_categories_${process.pid}.json`);
for (const cat of ['L', 'M', 'N', 'P', 'S', 'Z']) {
  const config = { version: '1.0', added_tokens: [], normalizer: null, post_processor: null, decoder: null,
    pre_tokenizer: { type: 'Split', pattern: { Regex: `\\p{${cat}}` }, behavior: 'Isolated', invert: false },
    model: { type: 'BPE', vocab: { a: 0 }, merges: [] } };
  fs.writeFileSync(tokenizerFile, JSON.stringify(config));
  const pre = Tokenizer.fromFile(tokenizerFile).getPreTokenizer();
  const found = [];
  const CHUNK = 20000;
  for (let i = 0; i < cps.length; i += CHUNK) {
    const chunk = cps.slice(i, i + CHUNK);
    const text = chunk.map((cp) => String.fromCodePoint(cp)).join('\u0001');
    const set = new Set(chunk.map((cp) => String.fromCodePoint(cp)));
    for (const [piece] of pre.preTokenizeString(text)) if (set.has(piece)) found.push(piece.codePointAt(0));
  }
  found.sort((a, b) => a - b);
  const ranges = [];
  for (const cp of found) {
    if (ranges.length && ranges[ranges.length - 1][1] === cp - 1) ranges[ranges.length - 1][1] = cp; else ranges.push([cp, cp]);
  }
  result[cat] = ranges;
  console.error(cat, found.length, ranges.length);
}
console.log(JSON.stringify(result));
