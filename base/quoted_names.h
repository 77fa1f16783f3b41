// Names in backquotes in a library's text, mapped by a command line: the
// libraries below the command lines name an option by its field
// ("`batch_size` must be at least 1") and the command line that took the
// option writes it as its flag ("--batch-size must be at least 1").
//
//   MapQuotedNames("`io_memory` 0", [](std::string_view n) {
//     return n == "io_memory" ? std::string("--io-memory") : std::string();
//   })  // "--io-memory 0"
#pragma once

#include <functional>
#include <string>
#include <string_view>

namespace nl {

// `text` with each `name` for which `map` gives a non-empty text replaced by
// it (backquotes included); other backquoted text is kept as it is.
std::string MapQuotedNames(std::string_view text,
                           const std::function<std::string(std::string_view)>& map);

// A command line's map: `field` -> "--field" with '_' as '-' where `known`
// says the command takes that flag.
std::string FlagsForFields(std::string_view text,
                           const std::function<bool(std::string_view flag)>& known);

}  // namespace nl
