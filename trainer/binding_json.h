// A rank's binding as the table shows it, as JSON text: what each rank puts
// in the store once and rank 0 reads back for every rank.
#pragma once

#include <string>

#include "trainer/diagnostics.h"

namespace nl::trainer {

std::string BindingToJson(const RankBinding& b);
// Throws (nlohmann's exceptions) on text that is not such an object.
RankBinding BindingFromJson(const std::string& text);

}  // namespace nl::trainer
