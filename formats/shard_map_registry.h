// Private to formats/ (shard.cc): the open shard readers' maps, so that a
// SIGBUS inside one (its data.mdb cut short while mapped) names the shard.
#pragma once

#include <cstdint>
#include <string>

namespace nl::shard_internal {

// Finds the map LMDB made of `data_path` (LMDB does not say where: its
// me_mapaddr is set only for MDB_FIXEDMAP) in /proc/self/maps, by the file's
// inode: the first such range, from the file's start and at least its
// length, not already registered. Registers it under `name` for the SIGBUS
// handler (installed on first use) and returns its slot; -1 when none is
// found or every slot is taken (the shard is then read without a name on
// SIGBUS; nothing else changes). Thread-safe.
int RegisterMap(const std::string& data_path, const std::string& name);

// The first byte of the map registered in `slot` (slot >= 0).
const uint8_t* MapBegin(int slot);

// Frees `slot` (-1: nothing). Call only once the map is unmapped.
void UnregisterMap(int slot);

}  // namespace nl::shard_internal
