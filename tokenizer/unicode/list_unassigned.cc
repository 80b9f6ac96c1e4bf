// Lists the code points (planes 0-3, hex, one per line) that the system PCRE2 considers
// unassigned (\p{Cn}). Used by gen_additions.sh; not part of the build.
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <cstdio>
#include <cstring>
#include <string>
int main() {
  int e;
  PCRE2_SIZE o;
  pcre2_code* c = pcre2_compile((PCRE2_SPTR) "^\\p{Cn}$", PCRE2_ZERO_TERMINATED,
                                PCRE2_UTF | PCRE2_UCP, &e, &o, nullptr);
  pcre2_match_data* m = pcre2_match_data_create(4, nullptr);
  for (unsigned cp = 0; cp <= 0x3FFFF; ++cp) {
    if (cp >= 0xD800 && cp <= 0xDFFF) continue;
    std::string s;
    if (cp < 0x80)
      s += (char)cp;
    else if (cp < 0x800) {
      s += (char)(0xC0 | (cp >> 6));
      s += (char)(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      s += (char)(0xE0 | (cp >> 12));
      s += (char)(0x80 | ((cp >> 6) & 0x3F));
      s += (char)(0x80 | (cp & 0x3F));
    } else {
      s += (char)(0xF0 | (cp >> 18));
      s += (char)(0x80 | ((cp >> 12) & 0x3F));
      s += (char)(0x80 | ((cp >> 6) & 0x3F));
      s += (char)(0x80 | (cp & 0x3F));
    }
    if (pcre2_match(c, (PCRE2_SPTR)s.data(), s.size(), 0, 0, m, nullptr) >= 0) printf("%x\n", cp);
  }
}
