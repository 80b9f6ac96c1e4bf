#!/usr/bin/env node
// HF tokenizers' batch encoder (@anush008/tokenizers, the Rust library, with its own thread
// pool: every core unless RAYON_NUM_THREADS says otherwise) over the prompts of an OpenAI Batch
// job file, the counterpart of the coordinator's validation in tools/bench/large_job.sh.
//
//   node tools/bench/hf_tokenize_job.js JOB.jsonl [MAX_LINES]
//
// Completion prompts are encoded with the special tokens (BOS, as the coordinator does), chat
// messages are rendered with the model's chat template (@huggingface/jinja, not timed) and
// encoded without. Only the encodeBatch calls are timed, in batches of 8192 texts. Prints the
// texts, the tokens and the seconds. Needs tools/ci/setup.d/tokenizer_npm.sh once.
'use strict';
const fs = require('fs');
const path = require('path');
const readline = require('readline');
const { createRequire } = require('module');

const references = path.join(__dirname, '..', '..', 'tests', 'tokenizer');
const requireRef = createRequire(path.join(references, 'package.json'));
const { Tokenizer, templateProcessing } = requireRef('@anush008/tokenizers');
const { Template } = requireRef('@huggingface/jinja');
const modelDir = path.join(references, 'node_modules', '@lenml', 'tokenizer-deepseek_v3', 'models');

const [jobFile, maxLinesArg] = process.argv.slice(2);
if (!jobFile) {
  process.stderr.write('usage: hf_tokenize_job.js JOB.jsonl [MAX_LINES]\n');
  process.exit(2);
}
const maxLines = maxLinesArg ? Number(maxLinesArg) : Infinity;
const kBatch = 8192;

(async () => {
  const config = JSON.parse(fs.readFileSync(path.join(modelDir, 'tokenizer_config.json'), 'utf8'));
  const content = (t) => (typeof t === 'string' ? t : t.content);
  const bos = content(config.bos_token), eos = content(config.eos_token);
  const plain = Tokenizer.fromFile(path.join(modelDir, 'tokenizer.json'));
  const withBos = Tokenizer.fromFile(path.join(modelDir, 'tokenizer.json'));
  withBos.setPostProcessor(templateProcessing(`${bos}:0 $A:0`, null, [[bos, plain.tokenToId(bos)]]));
  const template = new Template(config.chat_template);

  let texts = 0, tokens = 0, seconds = 0;
  const batches = { completion: [], chat: [] };
  const encode = async (kind) => {
    const batch = batches[kind];
    if (batch.length === 0) return;
    const start = process.hrtime.bigint();
    const encodings = kind === 'completion'
        ? await withBos.encodeBatch(batch, { addSpecialTokens: true })
        : await plain.encodeBatch(batch, { addSpecialTokens: false });
    seconds += Number(process.hrtime.bigint() - start) / 1e9;
    for (const e of encodings) tokens += e.getLength();
    texts += batch.length;
    batches[kind] = [];
  };
  const lines = readline.createInterface({ input: fs.createReadStream(jobFile), crlfDelay: Infinity });
  let n = 0;
  for await (const line of lines) {
    if (line.trim().length === 0) continue;
    if (++n > maxLines) break;
    const body = JSON.parse(line).body;
    if (typeof body.prompt === 'string') {
      batches.completion.push(body.prompt);
    } else if (Array.isArray(body.messages)) {
      batches.chat.push(template.render({ messages: body.messages, add_generation_prompt: true,
                                          bos_token: bos, eos_token: eos }));
    }
    for (const kind of ['completion', 'chat']) {
      if (batches[kind].length >= kBatch) await encode(kind);
    }
  }
  await encode('completion');
  await encode('chat');
  console.log(`hf encodeBatch: ${texts} texts, ${tokens} tokens, ${seconds.toFixed(2)} s, ` +
      `${(tokens / seconds).toFixed(0)} tokens/s`);
})();
