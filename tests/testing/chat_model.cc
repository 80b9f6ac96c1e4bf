#include "tests/testing/chat_model.h"

#include <dirent.h>
#include <limits.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "tokenizer/test_tokenizer_json.h"

namespace deepinfer::testing {

const char kTestChatTemplate[] =
    "{% set ns = namespace(system_prompt='') %}"
    "{%- for message in messages %}{%- if message['role'] == 'system' %}"
    "{% set ns.system_prompt = ns.system_prompt + message['content'] %}"
    "{%- endif %}{%- endfor %}"
    "{{ bos_token }}{{ ns.system_prompt }}"
    "{%- if tools %}<tools>{% for tool in tools %}{{ tool['function']['name'] }}: "
    "{{ tool['function'] | tojson }}\n{% endfor %}</tools>{% endif %}"
    "{%- for message in messages %}"
    "{%- if message['role'] == 'user' %}<user>{{ message['content'] }}"
    "{%- elif message['role'] == 'assistant' %}<assistant>"
    "{%- if message['content'] is not none %}{{ message['content'] }}{% endif %}"
    "{%- if message['tool_calls'] %}{% for call in message['tool_calls'] %}"
    "<call>{{ call['function']['name'] }} {{ call['function']['arguments'] }}</call>"
    "{% endfor %}{% endif %}{{ eos_token }}"
    "{%- elif message['role'] == 'tool' %}<output>{{ message['content'] }}</output>"
    "{%- endif %}{%- endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}";

absl::Status MakeChatModelDir(const std::string& fixture_dir, const std::string& out_dir) {
  if (mkdir(out_dir.c_str(), 0755) != 0 && errno != EEXIST) {
    return absl::InternalError(absl::StrCat("mkdir ", out_dir, ": ", std::strerror(errno)));
  }
  char real[PATH_MAX];
  if (realpath(fixture_dir.c_str(), real) == nullptr) {
    return absl::NotFoundError(absl::StrCat(fixture_dir, ": ", std::strerror(errno)));
  }
  DIR* dir = opendir(real);
  if (dir == nullptr) return absl::NotFoundError(absl::StrCat("cannot list ", real));
  while (dirent* entry = readdir(dir)) {
    const std::string name = entry->d_name;
    if (name == "." || name == "..") continue;
    const std::string link = out_dir + "/" + name;
    unlink(link.c_str());
    if (symlink(absl::StrCat(real, "/", name).c_str(), link.c_str()) != 0) {
      closedir(dir);
      return absl::InternalError(absl::StrCat("symlink ", link, ": ", std::strerror(errno)));
    }
  }
  closedir(dir);
  // The model may generate any id of its vocabulary, and the worker decodes each: ids the
  // test tokenizer lacks become tokens of their own ("<unused_N>").
  std::ifstream config_in(out_dir + "/config.json");
  nlohmann::json model_config = nlohmann::json::parse(config_in, nullptr, false);
  if (!model_config.is_object() || !model_config["vocab_size"].is_number_integer()) {
    return absl::InvalidArgumentError(absl::StrCat(fixture_dir, "/config.json has no vocab_size"));
  }
  nlohmann::json tokenizer_json = tokenizer::TestTokenizerJson();
  int next_id = 0;
  for (const auto& [token, id] : tokenizer_json["model"]["vocab"].items()) {
    next_id = std::max(next_id, id.get<int>() + 1);
  }
  for (const auto& added : tokenizer_json["added_tokens"]) {
    next_id = std::max(next_id, added["id"].get<int>() + 1);
  }
  for (int id = next_id; id < model_config["vocab_size"].get<int>(); ++id) {
    tokenizer_json["model"]["vocab"][absl::StrCat("<unused_", id, ">")] = id;
  }
  std::ofstream(out_dir + "/tokenizer.json") << tokenizer_json.dump();
  std::ofstream config(out_dir + "/tokenizer_config.json");
  config << nlohmann::json{{"bos_token", "<s>"},
                           {"eos_token", "</s>"},
                           {"chat_template", kTestChatTemplate}}
                .dump();
  if (!config.good()) return absl::InternalError(absl::StrCat("cannot write in ", out_dir));
  return absl::OkStatus();
}

}  // namespace deepinfer::testing
