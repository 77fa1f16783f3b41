// The settings every rank of a job must share, compared at the rendezvous
// (rendezvous.h, AgreeSettings) before the first step: a wrapper that gives
// one rank --batch-size 32 and another 16 stops every rank at once, naming
// the setting and each rank's value, instead of training mismatched
// all-reduces until one aborts.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "formats/manifest.h"
#include "trainer/options.h"

namespace nl::trainer {

// (name, value) pairs in one order; a name is the flag ("--batch-size") or
// says what it is ("--data (its manifest)").
using Settings = std::vector<std::pair<std::string, std::string>>;

// What must match: the data set (its manifest's CRC-32C, classes and
// training samples), model, batch size, image size, the train transform,
// order, seed, epochs and steps, the schedule (lr, momentum, weight decay,
// label smoothing, warm-up), where the images are resized, the evaluation
// split, the position a resume starts from (`resume_at`), and the sample
// order as the loader resolved it (`sequence`: SequenceOf(ReadPlan)).
Settings SharedSettings(const Options& o, const Manifest& m, const std::string& resume_at,
                        const std::string& sequence);

// What differs between ranks' settings (given in rank order), one entry a
// setting: "--seed (rank 0: 1; ranks 1 and 2: 2)"; empty when they agree.
std::vector<std::string> SettingsDiffer(const std::vector<Settings>& ranks);

// The transform in words: "train, pad-crop 4, flip, resize squash, decode
// fast, layout nchw".
std::string DescribeTransform(const TransformConfig& t);

// "0, 1 and 3".
std::string RankList(const std::vector<int>& ranks);

}  // namespace nl::trainer
