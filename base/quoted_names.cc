#include "base/quoted_names.h"

namespace nl {

std::string MapQuotedNames(std::string_view text,
                           const std::function<std::string(std::string_view)>& map) {
  std::string out;
  size_t i = 0;
  while (i < text.size()) {
    const size_t open = text.find('`', i);
    if (open == std::string_view::npos) break;
    const size_t close = text.find('`', open + 1);
    if (close == std::string_view::npos) break;
    out.append(text.substr(i, open - i));
    const std::string mapped = map(text.substr(open + 1, close - open - 1));
    out.append(mapped.empty() ? text.substr(open, close - open + 1) : std::string_view(mapped));
    i = close + 1;
  }
  out.append(text.substr(i));
  return out;
}

std::string FlagsForFields(std::string_view text,
                           const std::function<bool(std::string_view flag)>& known) {
  return MapQuotedNames(text, [&known](std::string_view name) {
    std::string flag = "--";
    for (char c : name) {
      if (!(c == '_' || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9'))) return std::string();
      flag.push_back(c == '_' ? '-' : c);
    }
    return name.empty() || !known(flag) ? std::string() : flag;
  });
}

}  // namespace nl
