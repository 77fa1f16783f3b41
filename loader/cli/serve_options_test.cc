// The shared options: flags -> config -> `loader serve` argv -> the same
// config; the transform defaults each command keeps; the sampler's arithmetic.
#include "loader/cli/serve_options.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "loader/cli/cli_options.h"
#include "loader/pipeline/pipeline.h"
#include "loader/pipeline/sampler.h"

namespace nl {
namespace {

// A fake environment for FinishServeOptions.
std::map<std::string, std::string>* g_env = nullptr;
const char* FakeEnv(const char* name) {
  if (g_env == nullptr) return nullptr;
  auto it = g_env->find(name);
  return it == g_env->end() ? nullptr : it->second.c_str();
}

// Parses `loader serve`'s options (argv without the program and "serve").
Result<ServeRequest> ParseServe(std::vector<std::string> args) {
  CLI::App app;
  ServeFlags flags;
  AddServeOptions(&app, &flags);
  std::reverse(args.begin(), args.end());  // CLI11 takes them last first
  try {
    app.parse(args);
  } catch (const CLI::ParseError& e) {
    return Status::InvalidArgument(std::string("CLI11: ") + e.what());
  }
  return FinishServeOptions(flags, &FakeEnv);
}

// ServeArgv's options, without the program and "serve".
std::vector<std::string> Options(const ServeRequest& r) {
  std::vector<std::string> a = ServeArgv("/x/loader", r);
  EXPECT_EQ(a.at(0), "/x/loader");
  EXPECT_EQ(a.at(1), "serve");
  return std::vector<std::string>(a.begin() + 2, a.end());
}

void ExpectSameRequest(const ServeRequest& x, const ServeRequest& y) {
  const PipelineConfig &p = x.service.pipeline, &q = y.service.pipeline;
  EXPECT_EQ(p.data_dir, q.data_dir);
  EXPECT_EQ(p.split, q.split);
  EXPECT_EQ(p.rank, q.rank);
  EXPECT_EQ(p.world, q.world);
  EXPECT_EQ(p.batch_size, q.batch_size);
  EXPECT_EQ(p.prefetch, q.prefetch);
  EXPECT_EQ(p.seed, q.seed);
  EXPECT_EQ(p.shuffle, q.shuffle);
  EXPECT_EQ(p.drop_last, q.drop_last);
  EXPECT_EQ(p.drop_last_batch, q.drop_last_batch);
  EXPECT_EQ(p.start_epoch, q.start_epoch);
  EXPECT_EQ(p.start_batch, q.start_batch);
  EXPECT_EQ(p.epochs, q.epochs);
  EXPECT_EQ(p.on_bad_record, q.on_bad_record);
  EXPECT_EQ(p.order, q.order);
  EXPECT_EQ(p.io_memory, q.io_memory);
  const TransformConfig &t = p.transform, &u = q.transform;
  EXPECT_EQ(t.image_size, u.image_size);
  EXPECT_EQ(t.resize, u.resize);
  EXPECT_EQ(t.train, u.train);
  EXPECT_EQ(t.pad_crop, u.pad_crop);
  EXPECT_EQ(t.random_resized_crop, u.random_resized_crop);
  EXPECT_EQ(t.flip, u.flip);
  EXPECT_EQ(t.layout, u.layout);
  EXPECT_EQ(t.normalize, u.normalize);
  EXPECT_EQ(t.mean, u.mean);
  EXPECT_EQ(t.std, u.std);
  EXPECT_EQ(x.service.job_id, y.service.job_id);
  EXPECT_EQ(x.service.attach_timeout_s, y.service.attach_timeout_s);
  EXPECT_EQ(x.service.stall_warning_s, y.service.stall_warning_s);
  EXPECT_EQ(x.service.delay_per_batch_ms, y.service.delay_per_batch_ms);
  EXPECT_EQ(x.local_rank, y.local_rank);
  EXPECT_EQ(x.local_world, y.local_world);
  EXPECT_EQ(x.threads, y.threads);
  EXPECT_EQ(x.plan.gpus, y.plan.gpus);
  EXPECT_EQ(x.plan.numa_node, y.plan.numa_node);
  EXPECT_EQ(x.plan.cpu_affinity, y.plan.cpu_affinity);
  EXPECT_EQ(x.plan.trainer_cores, y.plan.trainer_cores);
  EXPECT_EQ(x.plan.allow_shared_cores, y.plan.allow_shared_cores);
  EXPECT_EQ(x.plan.ignore_gpus, y.plan.ignore_gpus);
  EXPECT_EQ(x.plan.no_bind, y.plan.no_bind);
}

TEST(ServeOptions, FlagsToArgvAndBack) {
  const std::vector<std::string> flags = {"--data",
                                          "/d/c100",
                                          "--split",
                                          "test",
                                          "--batch-size",
                                          "96",
                                          "--prefetch",
                                          "3",
                                          "--seed",
                                          "17",
                                          "--no-shuffle",
                                          "--drop-last",
                                          "--drop-last-batch",
                                          "--on-bad-record",
                                          "skip",
                                          "--order",
                                          "blocks",
                                          "--io-memory",
                                          "96M",
                                          "--image-size",
                                          "40",
                                          "--resize",
                                          "shorter-crop",
                                          "--augment",
                                          "--random-resized-crop",
                                          "--no-flip",
                                          "--layout",
                                          "nhwc",
                                          "--normalize",
                                          "--mean",
                                          "0.5,0.25,0.125",
                                          "--std",
                                          "0.229,0.224,0.225",
                                          "--job-id",
                                          "job-7",
                                          "--rank",
                                          "5",
                                          "--world-size",
                                          "8",
                                          "--local-rank",
                                          "1",
                                          "--local-world-size",
                                          "4",
                                          "--epochs",
                                          "3",
                                          "--start-epoch",
                                          "1",
                                          "--start-batch",
                                          "2",
                                          "--threads",
                                          "6",
                                          "--attach-timeout",
                                          "12.5",
                                          "--stall-warning",
                                          "30",
                                          "--simulate-delay-ms",
                                          "0.75",
                                          "--gpus",
                                          "0,1,2,3",
                                          "--numa-node",
                                          "0,0,1,1",
                                          "--cpu-affinity",
                                          "0-3;4-7;8-11;12-15",
                                          "--trainer-cores",
                                          "2",
                                          "--allow-shared-cores",
                                          "--ignore-gpus",
                                          "--no-bind"};
  Result<ServeRequest> r = ParseServe(flags);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  const PipelineConfig& p = r->service.pipeline;
  EXPECT_EQ(p.data_dir, "/d/c100");
  EXPECT_EQ(p.rank, 5);
  EXPECT_EQ(p.world, 8);
  EXPECT_FALSE(p.shuffle);
  EXPECT_EQ(p.on_bad_record, OnBadRecord::kSkip);
  EXPECT_EQ(p.order, OrderChoice::kBlocks);
  EXPECT_EQ(p.io_memory, std::optional<uint64_t>(uint64_t{96} << 20));
  EXPECT_TRUE(p.transform.train && p.transform.random_resized_crop && !p.transform.flip);
  EXPECT_EQ(p.transform.pad_crop, 0);  // --augment with --random-resized-crop: no padding
  EXPECT_EQ(p.transform.mean[2], 0.125f);
  EXPECT_EQ(r->local_world, 4);
  EXPECT_EQ(r->threads, 6u);
  EXPECT_EQ(r->service.attach_timeout_s, 12.5);
  EXPECT_EQ(r->plan.trainer_cores, 2);

  Result<ServeRequest> back = ParseServe(Options(*r));
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  ExpectSameRequest(*r, *back);
  EXPECT_EQ(Options(*back), Options(*r));
}

TEST(ServeOptions, DefaultsRoundTripAndNothingComesFromTheChildsEnvironment) {
  std::map<std::string, std::string> env = {{"RANK", "3"}, {"WORLD_SIZE", "4"}};
  g_env = &env;
  Result<ServeRequest> r = ParseServe({"--data", "/d", "--job-id", "j"});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->service.pipeline.rank, 3);  // from $RANK
  EXPECT_EQ(r->service.pipeline.world, 4);
  EXPECT_EQ(r->service.pipeline.epochs, 0u);  // serve: as long as the consumer asks
  EXPECT_LT(r->service.attach_timeout_s, 0);
  const std::vector<std::string> argv = Options(*r);
  env = {{"RANK", "0"}, {"WORLD_SIZE", "1"}, {"LOCAL_WORLD_SIZE", "9"}};
  Result<ServeRequest> back = ParseServe(argv);
  g_env = nullptr;
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  ExpectSameRequest(*r, *back);  // every value was written out
  EXPECT_EQ(Options(*back), argv);
}

TEST(ServeOptions, ARequestBuiltInCodeParsesBack) {
  // As loader_bench builds one: its own parse of the shared options.
  CLI::App app;
  PipelineConfig pc;
  PipelineFlags pf;
  TransformFlags tf;
  AddPipelineOptions(&app, &pc, &pf);
  AddTransformOptions(&app, &pc.transform, &tf);
  std::vector<std::string> args = {"--data", "/d",           "--augment", "--pad-crop",
                                   "4",      "--image-size", "32"};
  std::reverse(args.begin(), args.end());
  app.parse(args);
  ASSERT_TRUE(FinishPipelineOptions(pf, &pc).ok());
  ASSERT_TRUE(FinishTransformOptions(tf, &pc.transform).ok());
  ServeRequest r;
  r.service.pipeline = pc;
  r.service.pipeline.rank = 1;
  r.service.pipeline.world = 2;
  r.service.job_id = "bench-1";
  r.service.attach_timeout_s = 60;
  r.local_rank = 1;
  r.local_world = 2;
  r.plan.numa_node = "0,1";
  r.plan.cpu_affinity = "0-1;2-3";
  const std::vector<std::string> argv = Options(r);
  EXPECT_NE(std::find(argv.begin(), argv.end(), "60"), argv.end());
  Result<ServeRequest> back = ParseServe(argv);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  ExpectSameRequest(r, *back);
  EXPECT_EQ(back->service.pipeline.transform.pad_crop, 4);
}

TEST(ServeOptions, BadValuesNameTheFlagOrTheVariable) {
  std::map<std::string, std::string> env = {{"RANK", "x1"}};
  g_env = &env;
  Result<ServeRequest> r = ParseServe({"--data", "/d", "--job-id", "j"});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("the environment variable RANK"), std::string::npos)
      << r.status().message();
  EXPECT_NE(r.status().message().find("'x1'"), std::string::npos);
  g_env = nullptr;
  r = ParseServe({"--data", "/d", "--job-id", "j", "--rank", "2", "--world-size", "2"});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(), "rank 2 is not below the world size 2");
  r = ParseServe({"--data", "/d", "--job-id", "j", "--pad-crop", "4"});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("add --augment"), std::string::npos);
}

// Parses the shape options with a command's transform defaults.
Result<TransformConfig> ParseTransform(TransformFlags defaults, std::vector<std::string> args) {
  CLI::App app;
  TransformConfig c;
  TransformFlags f = defaults;
  AddTransformOptions(&app, &c, &f, kTransformShape);
  std::reverse(args.begin(), args.end());
  try {
    app.parse(args);
  } catch (const CLI::ParseError& e) {
    return Status::InvalidArgument(e.what());
  }
  NL_RETURN_IF_ERROR(FinishTransformOptions(f, &c));
  return c;
}

TEST(TransformOptions, TheTrainersDefaultIsPadCrop4AndFlip) {
  TransformFlags trainer;
  trainer.augment = true;
  trainer.augment_pad_crop = 4;
  Result<TransformConfig> c = ParseTransform(trainer, {});
  ASSERT_TRUE(c.ok());
  EXPECT_TRUE(c->train && c->flip && !c->random_resized_crop);
  EXPECT_EQ(c->pad_crop, 4);
  c = ParseTransform(trainer, {"--augment"});
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->pad_crop, 4);
  c = ParseTransform(trainer, {"--random-resized-crop"});
  ASSERT_TRUE(c.ok());
  EXPECT_TRUE(c->random_resized_crop);
  EXPECT_EQ(c->pad_crop, 0);
  c = ParseTransform(trainer, {"--pad-crop", "2", "--no-flip"});
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->pad_crop, 2);
  EXPECT_FALSE(c->flip);
  c = ParseTransform(trainer, {"--no-augment"});
  ASSERT_TRUE(c.ok());
  EXPECT_FALSE(c->train);
  EXPECT_EQ(c->pad_crop, 0);
  c = ParseTransform(trainer, {"--no-augment", "--random-resized-crop"});
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("--no-augment"), std::string::npos);
}

// --decode auto (the default): the eval transform is exact, the train
// transform's decode is chosen per sample (SampleTransform::ChooseDecode);
// fast and exact are what they say for both.
TEST(TransformOptions, DecodeAutoIsExactForEvalAndChosenPerSampleForTrain) {
  Result<TransformConfig> c = ParseTransform({}, {});
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->decode, DecodeMode::kExact);
  c = ParseTransform({}, {"--augment", "--random-resized-crop"});
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->decode, DecodeMode::kAuto);
  EXPECT_EQ(c->auto_min_ratio, kAutoMinRatio);
  c = ParseTransform({}, {"--augment", "--decode", "fast"});
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->decode, DecodeMode::kFast);
  c = ParseTransform({}, {"--decode", "fast"});
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->decode, DecodeMode::kFast) << "the user's choice, for eval too";
  c = ParseTransform({}, {"--augment", "--decode", "exact"});
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->decode, DecodeMode::kExact);
  c = ParseTransform({}, {"--decode", "quick"});
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().message(), "--decode: quick not in {auto,exact,fast}");
}

TEST(TransformOptions, ElsewhereAugmentIsAskedFor) {
  Result<TransformConfig> c = ParseTransform({}, {});
  ASSERT_TRUE(c.ok());
  EXPECT_FALSE(c->train);
  c = ParseTransform({}, {"--augment"});
  ASSERT_TRUE(c.ok());
  EXPECT_TRUE(c->train);
  EXPECT_EQ(c->pad_crop, 0);
  c = ParseTransform({}, {"--augment", "--pad-crop", "1025"});
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().message(), "--pad-crop: '1025' is out of range (0..1024)");
  c = ParseTransform({}, {"--no-augment"});
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("--no-augment"), std::string::npos) << c.status().message();
}

TEST(FormatNumber, ShortestTextThatParsesBack) {
  EXPECT_EQ(FormatNumber(60.0), "60");
  EXPECT_EQ(FormatNumber(12.5), "12.5");
  EXPECT_EQ(FormatNumber(0.1), "0.1");
  EXPECT_EQ(FormatNumber(0.229), "0.229");
  EXPECT_EQ(FormatNumber(0.229f), "0.229");  // a float: the shortest text that gives it back
}

SamplerConfig Sampler(uint64_t n, int world, uint32_t batch, bool drop_last, bool drop_last_batch) {
  PipelineConfig c;
  c.world = world;
  c.batch_size = batch;
  c.drop_last = drop_last;
  c.drop_last_batch = drop_last_batch;
  return SamplerConfigFor(c, n);
}

TEST(BatchesPerEpoch, PaddedOrTrimmedThenWholeOrPartialBatches) {
  // 103 samples, 4 ranks: 26 each padded (ceil), 25 trimmed (floor).
  EXPECT_EQ(SamplesPerRank(Sampler(103, 4, 8, false, false)), 26u);
  EXPECT_EQ(SamplesPerRank(Sampler(103, 4, 8, true, false)), 25u);
  EXPECT_EQ(BatchesPerEpoch(Sampler(103, 4, 8, false, false)), 4u);  // 26 = 3 x 8 + 2
  EXPECT_EQ(BatchesPerEpoch(Sampler(103, 4, 8, false, true)), 3u);
  EXPECT_EQ(BatchesPerEpoch(Sampler(103, 4, 8, true, false)), 4u);  // 25 = 3 x 8 + 1
  EXPECT_EQ(BatchesPerEpoch(Sampler(103, 4, 8, true, true)), 3u);
  EXPECT_EQ(BatchesPerEpoch(Sampler(100, 4, 5, true, false)), 5u);  // exact: nothing dropped
  EXPECT_EQ(BatchesPerEpoch(Sampler(100, 4, 5, true, true)), 5u);
  EXPECT_EQ(BatchesPerEpoch(Sampler(3, 4, 8, true, false)), 0u);  // drop_last leaves nothing
  EXPECT_EQ(BatchesPerEpoch(Sampler(3, 4, 8, false, false)), 1u);
  EXPECT_EQ(BatchesPerEpoch(Sampler(10, 1, 0, false, false)), 0u);
  EXPECT_EQ(BatchesPerEpoch(Sampler(10, 0, 1, false, false)), 0u);
}

TEST(BatchesPerEpoch, IsTheSamplersOwnCount) {
  for (bool drop_last : {false, true}) {
    for (bool drop_batch : {false, true}) {
      for (uint64_t n : {97u, 100u, 128u}) {
        SamplerConfig c = Sampler(n, 3, 7, drop_last, drop_batch);
        c.rank = 2;
        Result<DistributedSampler> s = DistributedSampler::Create(c);
        ASSERT_TRUE(s.ok());
        EXPECT_EQ(s->batches_per_epoch(), BatchesPerEpoch(c));
        EXPECT_EQ(s->EpochIndices(0).size(), SamplesPerRank(c));
      }
    }
  }
}

}  // namespace
}  // namespace nl
