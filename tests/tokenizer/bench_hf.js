#!/usr/bin/env node
// Single-thread encode throughput of HF tokenizers (@anush008/tokenizers) on a JSONL corpus, the
// counterpart of //tokenizer:tokenizer_bench.
//
//   TOKENIZERS_PARALLELISM=false node tests/tokenizer/bench_hf.js CORPUS.jsonl [SECONDS]
//
// Reports two modes: one awaited encode() per text (includes the Node binding's per-call
// overhead) and encodeBatch() over the whole corpus (Rust loop; TOKENIZERS_PARALLELISM=false
// keeps it on one thread).
'use strict';
const fs = require('fs');
const path = require('path');

const [corpusFile, secondsArg] = process.argv.slice(2);
if (!corpusFile) {
  process.stderr.write('usage: bench_hf.js CORPUS.jsonl [SECONDS]\n');
  process.exit(2);
}
if (process.env.TOKENIZERS_PARALLELISM !== 'false') {
  process.stderr.write('bench_hf.js: set TOKENIZERS_PARALLELISM=false for a single-thread number\n');
  process.exit(2);
}
const { Tokenizer } = require('@anush008/tokenizers');
const modelDir = path.join(__dirname, 'node_modules', '@lenml', 'tokenizer-deepseek_v3', 'models');
const minSeconds = secondsArg ? Number(secondsArg) : 3;

const texts = fs.readFileSync(corpusFile, 'utf8').split('\n').filter((l) => l.length > 0)
    .map((l) => JSON.parse(l)).filter((row) => typeof row.text === 'string').map((row) => row.text);
const bytesPerPass = texts.reduce((n, t) => n + Buffer.byteLength(t, 'utf8'), 0);

async function measure(label, pass) {
  await pass();  // warm-up
  let passes = 0, tokens = 0;
  const start = process.hrtime.bigint();
  let seconds = 0;
  do {
    tokens += await pass();
    ++passes;
    seconds = Number(process.hrtime.bigint() - start) / 1e9;
  } while (seconds < minSeconds);
  console.log(`hf ${label}: ${texts.length} texts, ${passes} passes, ` +
      `${(bytesPerPass * passes / seconds / 1e6).toFixed(1)} MB/s, ${(tokens / seconds).toFixed(0)} tokens/s`);
}

(async () => {
  const tokenizer = Tokenizer.fromFile(path.join(modelDir, 'tokenizer.json'));
  await measure('encode (one call per text)', async () => {
    let n = 0;
    for (const text of texts) n += (await tokenizer.encode(text, null, { addSpecialTokens: false })).getLength();
    return n;
  });
  await measure('encodeBatch (whole corpus)', async () => {
    const encodings = await tokenizer.encodeBatch(texts, { addSpecialTokens: false });
    return encodings.reduce((n, e) => n + e.getLength(), 0);
  });
})();
