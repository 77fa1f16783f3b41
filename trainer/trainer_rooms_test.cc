// The rank's rooms that need LibTorch but no process group: checkpoints, the
// in-process batch source, the rendezvous's join over an in-memory store,
// and the classification of c10d/Gloo failures.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <c10/util/Exception.h>
#include <gloo/common/error.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <thread>
#include <torch/csrc/distributed/c10d/exception.h>
#include <torch/torch.h>

#include <cerrno>
#include <cstdlib>
#include <system_error>

#include "base/file_util.h"
#include "formats/image.h"
#include "tests/support/test_util.h"
#include "trainer/batch_source.h"
#include "trainer/checkpoint.h"
#include "trainer/comm_failure.h"
#include "trainer/models.h"
#include "trainer/rank_error.h"
#include "trainer/rendezvous.h"

namespace nl::trainer {
namespace {

// The first prefix.size() characters of s (so a failure shows the message).
std::string Head(const std::string& s, const std::string& prefix) { return s.substr(0, prefix.size()); }

// The message and kind of the RankError fn throws.
template <typename Fn>
std::pair<std::string, proc::FailureKind> ErrorOf(Fn fn) {
  try {
    fn();
  } catch (const RankError& e) {
    return {e.what(), e.kind()};
  }
  return {"(no error)", proc::FailureKind::kNone};
}

// ---- checkpoints ----

struct Trained {
  std::shared_ptr<Net> model;
  std::unique_ptr<torch::optim::SGD> opt;
};

Trained SmallCnn(uint64_t seed) {
  torch::manual_seed(seed);
  Trained t;
  t.model = MakeModel("smallcnn", 3);
  t.opt = std::make_unique<torch::optim::SGD>(t.model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  return t;
}

Checkpoint Fields() {
  Checkpoint c;
  c.epoch = 2;
  c.batch = 5;
  c.step = 37;
  c.seed = 11;
  c.world = 2;
  c.batch_size = 8;
  c.model = "smallcnn";
  c.classes = 3;
  c.train_samples = 100;
  c.order = "random";
  c.io_memory = 64 << 20;
  return c;
}

TEST(TrainerCheckpoint, RoundTripRestoresParametersAndFields) {
  testing::ScratchDir d;
  Trained a = SmallCnn(1);
  // One step, so the optimizer has momentum buffers to save.
  a.opt->zero_grad();
  torch::Tensor loss = a.model->forward(torch::rand({2, 3, 32, 32})).sum();
  loss.backward();
  a.opt->step();
  const std::string path = d / "checkpoint.pt";
  SaveCheckpoint(path, *a.model, *a.opt, Fields());
  EXPECT_FALSE(PathExists(TemporaryPath(path)));

  Trained b = SmallCnn(2);
  ASSERT_NE(ParamHash(*a.model), ParamHash(*b.model));
  const Checkpoint got = LoadCheckpoint(path, *b.model, *b.opt, Fields());
  EXPECT_EQ(ParamHash(*a.model), ParamHash(*b.model));
  const auto pa = a.model->parameters(), pb = b.model->parameters();
  ASSERT_EQ(pa.size(), pb.size());
  for (size_t i = 0; i < pa.size(); ++i) EXPECT_TRUE(torch::equal(pa[i], pb[i])) << "parameter " << i;
  EXPECT_EQ(got.epoch, 2);
  EXPECT_EQ(got.batch, 5);
  EXPECT_EQ(got.step, 37);
  EXPECT_EQ(got.seed, 11);
  EXPECT_EQ(got.world, 2);
  EXPECT_EQ(got.batch_size, 8);
  EXPECT_EQ(got.model, "smallcnn");
  EXPECT_EQ(got.classes, 3);
  EXPECT_EQ(got.train_samples, 100);
  EXPECT_EQ(got.order, "random");
  EXPECT_EQ(got.io_memory, 64 << 20);
}

TEST(TrainerCheckpoint, RefusesOneThatDoesNotFit) {
  testing::ScratchDir d;
  Trained a = SmallCnn(1);
  const std::string path = d / "checkpoint.pt";
  SaveCheckpoint(path, *a.model, *a.opt, Fields());
  Trained b = SmallCnn(2);
  const uint64_t before = ParamHash(*b.model);

  Checkpoint ranks = Fields();
  ranks.world = 4;
  auto e = ErrorOf([&] { LoadCheckpoint(path, *b.model, *b.opt, ranks); });
  EXPECT_EQ(e.first, "the checkpoint " + path +
                         " was written for 2 ranks of batch 8; this run has 4 of 8 (the sample order would "
                         "differ): resume with the same ranks and batch size");
  EXPECT_EQ(e.second, proc::FailureKind::kOwn);

  Checkpoint data = Fields();
  data.train_samples = 50;
  EXPECT_EQ(ErrorOf([&] { LoadCheckpoint(path, *b.model, *b.opt, data); }).first,
            "the checkpoint " + path +
                " was written for a data set of 3 classes and 100 training samples; --data has 3 and 50 "
                "(resume on the data set it was trained on)");

  Checkpoint model = Fields();
  model.model = "resnet18";
  EXPECT_EQ(ErrorOf([&] { LoadCheckpoint(path, *b.model, *b.opt, model); }).first,
            "the checkpoint " + path + " was written for --model smallcnn; this run has --model resnet18");

  // Another order: before, a resume in blocks order of a random-order run
  // went on without a word (of 2,000 samples, 467 trained twice, 467 never).
  Checkpoint blocks = Fields();
  blocks.order = "blocks of 6 samples, 600 a window";
  EXPECT_EQ(ErrorOf([&] { LoadCheckpoint(path, *b.model, *b.opt, blocks); }).first,
            "the checkpoint " + path +
                " was written for a run that read its samples in order random; this run reads them in order blocks "
                "of 6 samples, 600 a window (the rest of the epoch would train some samples twice and others never): "
                "resume with --order random");
  const std::string bpath = d / "blocks.pt";
  SaveCheckpoint(bpath, *a.model, *a.opt, blocks);
  Checkpoint wider = blocks;
  wider.order = "blocks of 12 samples, 600 a window";
  EXPECT_EQ(ErrorOf([&] { LoadCheckpoint(bpath, *b.model, *b.opt, wider); }).first,
            "the checkpoint " + bpath +
                " was written for a run that read its samples in order blocks of 6 samples, 600 a window; this run "
                "reads them in order blocks of 12 samples, 600 a window (the rest of the epoch would train some "
                "samples twice and others never): resume with --order blocks --io-memory 67108864 on the same ranks");
  // A checkpoint of an earlier trainer (no order recorded): random order's
  // sequence is as it was, so it resumes so; blocks were sized otherwise
  // then, so a resume in blocks order is refused.
  Checkpoint older = Fields();
  older.order.clear();
  const std::string opath = d / "older.pt";
  SaveCheckpoint(opath, *a.model, *a.opt, older);
  EXPECT_EQ(ErrorOf([&] { LoadCheckpoint(opath, *b.model, *b.opt, blocks); }).first,
            "the checkpoint " + opath +
                " was written for a run whose sample order it does not record (an earlier trainer, which sized "
                "blocks otherwise); this run reads them in order blocks of 6 samples, 600 a window: resume with "
                "--order random if that run read in random order, else start again");
  EXPECT_EQ(ParamHash(*b.model), before) << "a refused checkpoint changes nothing";
  EXPECT_NO_THROW(LoadCheckpoint(opath, *b.model, *b.opt, Fields()));
}

TEST(TrainerCheckpoint, NamesAFileThatIsNotOne) {
  testing::ScratchDir d;
  testing::WriteText(d / "junk.pt", "not a checkpoint");
  Trained b = SmallCnn(2);
  auto e = ErrorOf([&] { LoadCheckpoint(d / "junk.pt", *b.model, *b.opt, Fields()); });
  const std::string want = "cannot resume from " + (d / "junk.pt") +
                           ": it is not a checkpoint of this trainer (not a zip archive, as checkpoints are)";
  EXPECT_EQ(Head(e.first, want), want);
  EXPECT_EQ(e.first.find('\n'), std::string::npos) << "one line: " << e.first;
  EXPECT_EQ(e.second, proc::FailureKind::kOwn);
}

// A checkpoint cut short (a copy that stopped half way, or its last 10
// bytes lost) is named a damaged checkpoint, not "not a checkpoint"; one
// whose archive is whole but broken inside is damaged too.
TEST(TrainerCheckpoint, NamesACheckpointCutShortAsDamaged) {
  testing::ScratchDir d;
  Trained a = SmallCnn(1);
  SaveCheckpoint(d / "ck.pt", *a.model, *a.opt, Fields());
  const std::string whole = *ReadFileToString(d / "ck.pt");
  for (size_t keep : {whole.size() / 2, whole.size() - 10}) {
    SCOPED_TRACE(keep);
    testing::WriteText(d / "cut.pt", whole.substr(0, keep));
    Trained b = SmallCnn(2);
    auto e = ErrorOf([&] { LoadCheckpoint(d / "cut.pt", *b.model, *b.opt, Fields()); });
    const std::string want = "cannot resume from " + (d / "cut.pt") + ": it is a damaged checkpoint: cut short (its " +
                             std::to_string(keep) + " bytes begin as a checkpoint's archive, but the archive's end "
                             "is missing): resume from another checkpoint";
    EXPECT_EQ(Head(e.first, want), want);
    EXPECT_EQ(e.first.find('\n'), std::string::npos) << "one line: " << e.first;
  }
  // The archive's directory overwritten, its end record kept.
  std::string broken = whole;
  const size_t dir = broken.rfind(std::string("PK\x01\x02", 4));
  ASSERT_NE(dir, std::string::npos);
  for (size_t i = dir; i < dir + 40; ++i) broken[i] = 'x';
  testing::WriteText(d / "broken.pt", broken);
  Trained b = SmallCnn(2);
  auto e = ErrorOf([&] { LoadCheckpoint(d / "broken.pt", *b.model, *b.opt, Fields()); });
  const std::string want = "cannot resume from " + (d / "broken.pt") +
                           ": it is a damaged checkpoint (its archive cannot be read): resume from another checkpoint";
  EXPECT_EQ(Head(e.first, want), want);

  auto message = [&](const std::string& name, const std::string& bytes) {
    testing::WriteText(d / name, bytes);
    Trained t = SmallCnn(2);
    return ErrorOf([&] { LoadCheckpoint(d / name, *t.model, *t.opt, Fields()); }).first;
  };
  const std::string empty = "cannot resume from " + (d / "empty.pt") +
                            ": it is empty (0 bytes): a damaged checkpoint, cut short to nothing: resume from another "
                            "checkpoint";
  EXPECT_EQ(Head(message("empty.pt", ""), empty), empty);
  const std::string head = "cannot resume from " + (d / "head.pt") +
                           ": it is a damaged checkpoint (its first bytes are not an archive's): resume from another "
                           "checkpoint";
  EXPECT_EQ(Head(message("head.pt", "XXXX" + whole.substr(4)), head), head);
  // Another program's zip archive is no checkpoint, not a damaged one.
  ASSERT_EQ(std::system(("/usr/bin/python3 -c \"import zipfile,sys; zipfile.ZipFile(sys.argv[1], 'w').writestr('a.txt', "
                         "'hello')\" " + (d / "other.zip")).c_str()),
            0);
  const std::string zip = "cannot resume from " + (d / "other.pt") +
                          ": it is not a checkpoint of this trainer (a zip archive whose entries, a.txt first, are "
                          "not a checkpoint's)";
  EXPECT_EQ(Head(message("other.pt", *ReadFileToString(d / "other.zip")), zip), zip);
}

// A checkpoint after one step (so the optimizer has momentum), at path.
Trained SavedAfterAStep(const std::string& path) {
  Trained a = SmallCnn(1);
  a.opt->zero_grad();
  a.model->forward(torch::rand({2, 3, 32, 32})).sum().backward();
  a.opt->step();
  SaveCheckpoint(path, *a.model, *a.opt, Fields());
  return a;
}

// The checkpoint at `from` rewritten with `t`'s tensors but every other
// entry (the fields, and the checksums) as they were: a damaged file that
// stays a readable archive. `keep_checksums` false leaves them out.
void Rewrite(const std::string& from, const std::string& to, Trained& t, bool keep_checksums) {
  torch::serialize::InputArchive in;
  in.load_from(from);
  torch::serialize::OutputArchive out, m, o;
  t.model->save(m);
  t.opt->save(o);
  out.write("model", m);
  out.write("optimizer", o);
  for (const char* k : {"epoch", "batch", "step", "seed", "world", "batch_size", "num_classes", "train_samples",
                        "epochs", "max_steps", "warmup_steps", "image_size", "lr", "momentum", "weight_decay",
                        "label_smoothing", "tensor_crc32c"}) {
    if (!keep_checksums && std::string(k) == "tensor_crc32c") continue;
    torch::Tensor v;
    ASSERT_TRUE(in.try_read(k, v)) << k;
    out.write(k, v);
  }
  for (const char* k : {"model_name", "tensor_names"}) {
    if (!keep_checksums && std::string(k) == "tensor_names") continue;
    c10::IValue v;
    ASSERT_TRUE(in.try_read(k, v)) << k;
    out.write(k, v);
  }
  out.save_to(to);
}

TEST(TrainerCheckpoint, RefusesATensorThatIsNotWhatWasWritten) {
  testing::ScratchDir d;
  const std::string path = d / "checkpoint.pt";
  Trained a = SavedAfterAStep(path);
  {
    torch::NoGradGuard no_grad;
    auto params = a.model->named_parameters();
    params[0].value().neg_();  // every weight of the first layer, its sign bit flipped
  }
  const std::string bad = d / "damaged.pt";
  Rewrite(path, bad, a, true);
  Trained b = SmallCnn(2);
  const std::string first = a.model->named_parameters()[0].key();
  auto e = ErrorOf([&] { LoadCheckpoint(bad, *b.model, *b.opt, Fields()); });
  EXPECT_EQ(e.first, "cannot resume from " + bad + ": its model parameter " + first +
                         " does not match the checksum written with it (the file is damaged: resume from "
                         "another checkpoint)");
  EXPECT_EQ(e.second, proc::FailureKind::kOwn);
  // The intact one still loads.
  Trained c = SmallCnn(3);
  LoadCheckpoint(path, *c.model, *c.opt, Fields());
}

TEST(TrainerCheckpoint, RefusesOneWithoutChecksums) {
  testing::ScratchDir d;
  const std::string path = d / "checkpoint.pt";
  Trained a = SavedAfterAStep(path);
  const std::string old = d / "old.pt";
  Rewrite(path, old, a, false);
  Trained b = SmallCnn(2);
  EXPECT_EQ(ErrorOf([&] { LoadCheckpoint(old, *b.model, *b.opt, Fields()); }).first,
            "cannot resume from " + old +
                ": it has no checksums (not a checkpoint of this trainer, or one from an older version)");
}

TEST(TrainerCheckpoint, RunChangesNameWhatAResumeWouldChange) {
  Checkpoint saved = Fields(), now = Fields();
  saved.epochs = 2;
  saved.lr = 0.1;
  saved.max_steps = 20;
  now.epochs = 3;
  now.lr = 0.1;
  EXPECT_EQ(RunChanges(saved, now), std::vector<std::string>{"--epochs 3 (the checkpoint's run: 2)"});
  now.lr = 0.05;
  now.image_size = 64;
  EXPECT_EQ(RunChanges(saved, now),
            (std::vector<std::string>{"--epochs 3 (the checkpoint's run: 2)", "--image-size 64 (the checkpoint's "
                                      "run: 0)", "--lr 0.05 (the checkpoint's run: 0.1)"}));
  now = saved;
  EXPECT_TRUE(RunChanges(saved, now).empty());
}

TEST(TrainerCheckpoint, SaveNamesTheCheckpointWhenItCannotWrite) {
  testing::ScratchDir d;
  Trained a = SmallCnn(1);
  const std::string path = d / "missing-dir/checkpoint.pt";
  EXPECT_EQ(ErrorOf([&] { SaveCheckpoint(path, *a.model, *a.opt, Fields()); }).first,
            "cannot create the checkpoint " + TemporaryPath(path) + ": No such file or directory");
  const std::string fifo = d / "fifo.pt";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_EQ(ErrorOf([&] { SaveCheckpoint(fifo, *a.model, *a.opt, Fields()); }).first,
            "will not replace " + fifo + ": it is not a regular file (a device, FIFO, socket or directory)");
}

// ---- the in-process batch source ----

// 10 PNG samples of 8x8, labels i % 2.
std::string ShardSet(const testing::ScratchDir& d) {
  std::vector<std::vector<uint8_t>> records;
  for (uint32_t i = 0; i < 10; ++i) {
    RecordHeader h;
    h.label = i % 2;
    h.encoding = Encoding::kPng;
    h.width = h.height = 8;
    records.push_back(testing::CraftRecord(h, *EncodePng(testing::PatternImage(8, 8, i))));
  }
  testing::WriteShardSetForTest(d / "set", records);
  return d / "set";
}

TEST(TrainerBatchSource, InprocessDeliversTheEpochInOrder) {
  testing::ScratchDir d;
  PipelineConfig c;
  c.data_dir = ShardSet(d);
  c.batch_size = 4;
  c.prefetch = 2;
  c.shuffle = false;
  c.epochs = 1;
  c.transform.image_size = 8;
  Geometry g;
  g.ring_size = g.model_size = 8;
  InprocessSource src(c, g, 0);
  EXPECT_EQ(src.loader_pid(), 0);
  const std::vector<uint32_t> sizes = {4, 4, 2};
  int64_t label_index = 0;
  for (uint64_t b = 0; b < sizes.size(); ++b) {
    double data_ms = -1;
    Batch batch = src.Next(&data_ms);
    EXPECT_GE(data_ms, 0);
    EXPECT_EQ(batch.epoch, 0u);
    EXPECT_EQ(batch.batch, b);
    ASSERT_EQ(batch.size, sizes[b]);
    EXPECT_EQ(batch.x.sizes().vec(), (std::vector<int64_t>{sizes[b], 3, 8, 8}));
    EXPECT_EQ(batch.x.scalar_type(), torch::kFloat32);
    for (uint32_t i = 0; i < batch.size; ++i, ++label_index) {
      EXPECT_EQ(batch.y[i].item<int64_t>(), label_index % 2) << "sample " << label_index;
    }
  }
  double data_ms = 0;
  auto e = ErrorOf([&] { src.Next(&data_ms); });
  EXPECT_EQ(Head(e.first, "its loader pipeline: Out of range"), "its loader pipeline: Out of range");
  src.Finish();
}

TEST(TrainerBatchSource, InprocessNamesAShardSetItCannotOpen) {
  testing::ScratchDir d;
  PipelineConfig c;
  c.data_dir = d / "nothing-here";
  c.transform.image_size = 8;
  auto e = ErrorOf([&] { InprocessSource src(c, Geometry{}, 0); });
  EXPECT_EQ(Head(e.first, "cannot open its loader pipeline: "), "cannot open its loader pipeline: ");
  EXPECT_NE(e.first.find("nothing-here"), std::string::npos) << e.first;
}

TEST(TrainerBatchSource, NormalizeUsesImageNetStatisticsAndResizes) {
  Geometry g;
  g.ring_size = 4;
  g.model_size = 8;
  torch::Tensor x = Normalize(torch::full({1, 3, 4, 4}, 255.0f), g);
  EXPECT_EQ(x.sizes().vec(), (std::vector<int64_t>{1, 3, 8, 8}));
  const float mean[3] = {0.485f, 0.456f, 0.406f}, stdv[3] = {0.229f, 0.224f, 0.225f};
  for (int ch = 0; ch < 3; ++ch) {
    const float want = (255.0f - mean[ch] * 255) / (stdv[ch] * 255);
    EXPECT_NEAR(x[0][ch][5][2].item<float>(), want, 1e-4) << "channel " << ch;
  }
  const uint8_t pixels[3] = {0, 0, 0};
  const int64_t label = 7;
  g.ring_size = g.model_size = 1;
  Batch b = FromHost(pixels, &label, 1, g);
  EXPECT_EQ(b.y[0].item<int64_t>(), 7);
  EXPECT_NEAR(b.x[0][0][0][0].item<float>(), -0.485f / 0.229f, 1e-4);
}

// ---- the rendezvous's join ----

std::chrono::milliseconds Ms(int n) { return std::chrono::milliseconds(n); }

TEST(TrainerRendezvous, OneRankJoinsAlone) {
  c10d::HashStore store;
  Join(store, 0, 1, false, "h:1", Ms(1000));
  const std::vector<uint8_t> w = store.get("world/0");
  EXPECT_EQ(std::string(w.begin(), w.end()), "1");
}

TEST(TrainerRendezvous, NamesTheRanksThatNeverCameAsAnEcho) {
  c10d::HashStore store;
  auto e = ErrorOf([&] { Join(store, 0, 3, false, "127.0.0.1:29500", Ms(100)); });
  EXPECT_EQ(e.first,
            "waited 0.1 s at the rendezvous 127.0.0.1:29500 for ranks 1 and 2 of 3: are they started, with the "
            "same MASTER_ADDR, MASTER_PORT and WORLD_SIZE?");
  EXPECT_EQ(e.second, proc::FailureKind::kEcho);
}

TEST(TrainerRendezvous, RefusesASecondRankOfTheSameNumber) {
  c10d::HashStore store;
  store.add("join/1", 1);
  auto e = ErrorOf([&] { Join(store, 1, 2, false, "h:1", Ms(100)); });
  EXPECT_EQ(e.first,
            "rank 1 joined the rendezvous at h:1 twice: two processes were started with RANK=1 (each needs its "
            "own), or that address is not this job's store");
  EXPECT_EQ(e.second, proc::FailureKind::kOwn);
}

// Two jobs on one port under our launcher: the second job's rank 0 cannot
// host its store (and says so); its rank 1 reaches the first job's store,
// where rank 1 has joined already: an echo, so rank 0 is named.
TEST(TrainerRendezvous, UnderOurLauncherASecondJoinIsAnotherJobsStoreAndAnEcho) {
  c10d::HashStore store;
  store.add("join/1", 1);
  auto e = ErrorOf([&] { Join(store, 1, 2, true, "h:1", Ms(100)); });
  EXPECT_EQ(e.first,
            "rank 1 joined the rendezvous at h:1 twice, and this launcher started it once: that store is another "
            "job's (the port was taken, so this job's rank 0 could not host its store there; it says so)");
  EXPECT_EQ(e.second, proc::FailureKind::kEcho);
}

TEST(TrainerRendezvous, NamesAnotherWorldSize) {
  c10d::HashStore store;
  const std::string three = "3";
  store.set("world/0", std::vector<uint8_t>(three.begin(), three.end()));
  auto e = ErrorOf([&] { Join(store, 1, 2, false, "h:1", Ms(100)); });
  EXPECT_EQ(e.first,
            "this rank has WORLD_SIZE=2 but rank 0 has WORLD_SIZE=3: start every rank of a job with the same "
            "WORLD_SIZE");
  EXPECT_EQ(e.second, proc::FailureKind::kOwn);
}

// A store whose connection is gone: every call throws as TCPStore's does.
class LostStore : public c10d::Store {
 public:
  void set(const std::string&, const std::vector<uint8_t>&) override { Lost(); }
  std::vector<uint8_t> get(const std::string&) override { Lost(); }
  int64_t add(const std::string&, int64_t) override { Lost(); }
  bool deleteKey(const std::string&) override { Lost(); }
  bool check(const std::vector<std::string>&) override { Lost(); }
  int64_t getNumKeys() override { Lost(); }
  void wait(const std::vector<std::string>&) override { Lost(); }
  void wait(const std::vector<std::string>&, const std::chrono::milliseconds&) override { Lost(); }

 private:
  [[noreturn]] static void Lost() { throw std::system_error(ECONNRESET, std::generic_category(), "recv"); }
};

TEST(TrainerRendezvous, ALostStoreIsAnEcho) {
  LostStore store;
  auto e = ErrorOf([&] { Join(store, 1, 2, false, "h:1", Ms(100)); });
  EXPECT_EQ(Head(e.first, "lost the rendezvous store at h:1 during the rendezvous (rank 0 hosts it: it has "
                                  "ended or stopped; its own error says why): recv: "), "lost the rendezvous store at h:1 during the rendezvous (rank 0 hosts it: it has "
                                  "ended or stopped; its own error says why): recv: ");
  EXPECT_EQ(e.second, proc::FailureKind::kEcho);
}

// ---- the settings every rank must share ----

TEST(TrainerRendezvous, RanksWithTheSameSettingsGoOn) {
  c10d::HashStore store;
  const Settings s = {{"--model", "smallcnn"}, {"--batch-size", "16"}};
  std::thread other([&] { AgreeSettings(store, 1, 2, s, "h:1", Ms(5000)); });
  AgreeSettings(store, 0, 2, s, "h:1", Ms(5000));
  other.join();
}

// A value with a newline in it (an --eval-split name can hold one) stays one value.
TEST(TrainerRendezvous, AValueWithANewlineIsComparedWhole) {
  c10d::HashStore store;
  const Settings zero = {{"--eval-split", "a\nb"}, {"--seed", "1"}};
  const Settings one = {{"--eval-split", "a\nc"}, {"--seed", "1"}};
  std::pair<std::string, proc::FailureKind> e1;
  std::thread other([&] { e1 = ErrorOf([&] { AgreeSettings(store, 1, 2, one, "h:1", Ms(5000)); }); });
  auto e0 = ErrorOf([&] { AgreeSettings(store, 0, 2, zero, "h:1", Ms(5000)); });
  other.join();
  const std::string want =
      "the ranks' settings differ, so every rank stops before its first step: --eval-split (rank 0: a\\nb; rank "
      "1: a\\nc) (start every rank with the same settings)";
  EXPECT_EQ(e0.first, want);
  EXPECT_EQ(e1.first, want);
}

TEST(TrainerRendezvous, EveryRankNamesTheSettingsThatDiffer) {
  c10d::HashStore store;
  const Settings zero = {{"--model", "smallcnn"}, {"--batch-size", "32"}, {"--seed", "1"}};
  const Settings one = {{"--model", "smallcnn"}, {"--batch-size", "16"}, {"--seed", "1"}};
  std::pair<std::string, proc::FailureKind> e1;
  std::thread other([&] { e1 = ErrorOf([&] { AgreeSettings(store, 1, 2, one, "h:1", Ms(5000)); }); });
  auto e0 = ErrorOf([&] { AgreeSettings(store, 0, 2, zero, "h:1", Ms(5000)); });
  other.join();
  const std::string want =
      "the ranks' settings differ, so every rank stops before its first step: --batch-size (rank 0: 32; rank 1: "
      "16) (start every rank with the same settings)";
  EXPECT_EQ(e0.first, want);
  EXPECT_EQ(e1.first, want);
  EXPECT_EQ(e0.second, proc::FailureKind::kOwn);
  // Rank 0 stopped only after rank 1 had read every rank's settings.
  EXPECT_TRUE(store.check({"settings_read/1"}));
}

// ---- failure classification: one case per wording ----

c10::Error TorchError(const std::string& msg) { return c10::Error(msg, "  (backtrace)", nullptr); }

TEST(TrainerCommFailure, GlooTimeouts) {
  for (const char* w : {
           "[../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting 5000ms for recv "
           "operation to complete",
           "[../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:133] Timed out waiting 5000ms for send "
           "operation to complete",
           "[../third_party/gloo/gloo/transport/tcp/pair.cc:589] Application timeout caused pair closure",
           "[../third_party/gloo/gloo/transport/tcp/pair.cc:448] Read timeout [127.0.0.1]:39502",
           "[../third_party/gloo/gloo/transport/tcp/pair.cc:330] Write timeout [127.0.0.1]:39502",
           "[../third_party/gloo/gloo/transport/tcp/pair.cc:143] Connect timeout [127.0.0.1]:39502",
       }) {
    EXPECT_EQ(ClassifyCommFailure(gloo::IoException(w)), CommFailure::kTimeout) << w;
  }
}

TEST(TrainerCommFailure, GlooLostPeers) {
  for (const char* w : {
           "[../third_party/gloo/gloo/transport/tcp/pair.cc:598] Connection closed by peer [127.0.0.1]:22941",
           "[../third_party/gloo/gloo/transport/tcp/pair.cc:575] Read error [127.0.0.1]:22941: Connection reset "
           "by peer",
           "[../third_party/gloo/gloo/transport/tcp/pair.cc:377] Socket closed [127.0.0.1]:22941",
           "[../third_party/gloo/gloo/transport/tcp/pair.cc:411] Socket unexpectedly closed [127.0.0.1]:22941",
           "[../third_party/gloo/gloo/transport/tcp/pair.cc:575] Read error [127.0.0.1]:22941: Broken pipe",
       }) {
    EXPECT_EQ(ClassifyCommFailure(gloo::IoException(w)), CommFailure::kPeerLost) << w;
  }
  // Any other I/O failure of a pair is its peer's connection too (by type).
  EXPECT_EQ(ClassifyCommFailure(gloo::IoException("[pair.cc:1] getpeername: Bad file descriptor")),
            CommFailure::kPeerLost);
  // Gloo's own other failures are not.
  EXPECT_EQ(ClassifyCommFailure(gloo::Exception("[allreduce.cc:1] Gloo only supports these types")),
            CommFailure::kOther);
}

TEST(TrainerCommFailure, NcclAbortsAreLostPeers) {
  // ProcessGroupNCCL's watchdog, once another rank failed (CUDA LibTorch only).
  EXPECT_EQ(ClassifyCommFailure(TorchError("NCCL communicator was aborted on rank 1.  Original reason for failure "
                                           "was: NCCL error: remote process exited or there was a network error")),
            CommFailure::kPeerLost);
}

TEST(TrainerCommFailure, LibTorchTimeouts) {
  EXPECT_EQ(ClassifyCommFailure(TorchError("Operation timed out!")), CommFailure::kTimeout);  // Work::wait
  EXPECT_EQ(ClassifyCommFailure(TorchError("Socket Timeout")), CommFailure::kTimeout);       // TCPStore
  EXPECT_EQ(ClassifyCommFailure(TorchError("Wait timeout")), CommFailure::kTimeout);
  EXPECT_EQ(ClassifyCommFailure(TorchError("Timeout waiting for key: world/1 after 3000 ms")), CommFailure::kTimeout);
  EXPECT_EQ(ClassifyCommFailure(c10d::TimeoutError(
                "The client socket has timed out after 3000ms while trying to connect to (127.0.0.1, 29500).")),
            CommFailure::kTimeout);
}

TEST(TrainerCommFailure, SystemErrorsByCode) {
  EXPECT_EQ(ClassifyCommFailure(std::system_error(ETIMEDOUT, std::generic_category(), "recv")),
            CommFailure::kTimeout);
  EXPECT_EQ(ClassifyCommFailure(std::system_error(ECONNRESET, std::generic_category(), "recv")),
            CommFailure::kPeerLost);
  EXPECT_EQ(ClassifyCommFailure(std::system_error(EPIPE, std::system_category(), "send")), CommFailure::kPeerLost);
  EXPECT_EQ(ClassifyCommFailure(std::system_error(ECONNREFUSED, std::generic_category(), "connect")),
            CommFailure::kPeerLost);
  EXPECT_EQ(ClassifyCommFailure(std::system_error(ENOMEM, std::generic_category(), "mmap")), CommFailure::kOther);
}

TEST(TrainerCommFailure, OtherFailures) {
  EXPECT_EQ(ClassifyCommFailure(TorchError("Tensor list must be nonempty")), CommFailure::kOther);
  EXPECT_EQ(ClassifyCommFailure(std::runtime_error("out of memory")), CommFailure::kOther);
  EXPECT_STREQ(CommFailureName(CommFailure::kPeerLost), "peer lost");
}

TEST(TrainerCommFailure, TextHasNoBacktrace) {
  EXPECT_EQ(FailureText(TorchError("Operation timed out!")), "Operation timed out!");
  EXPECT_EQ(FailureText(gloo::IoException("Connection closed by peer [::1]:5")), "Connection closed by peer [::1]:5");
}

}  // namespace
}  // namespace nl::trainer
