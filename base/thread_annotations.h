// Lock rules the compiler checks: clang's thread-safety analysis
// (-Wthread-safety; CMake's NL_THREAD_SAFETY=ON, which CI's TSan build sets)
// reads these attributes and refuses code that touches a member without the
// lock that guards it, or calls a function without the lock it requires.
// Under other compilers they expand to nothing.
//
//   class Counter {
//    public:
//     void Add() NL_EXCLUDES(mu_) {
//       MutexLock lock(&mu_);
//       AddLocked();
//     }
//    private:
//     void AddLocked() NL_REQUIRES(mu_) { ++count_; }
//     Mutex mu_;                            // base/mutex.h
//     uint64_t count_ NL_GUARDED_BY(mu_) = 0;
//   };
//
// The names are clang's attributes' (its "Thread Safety Analysis" page),
// with the project's prefix: `RELEASE` and `REQUIRES` are taken elsewhere
// (<scsi/scsi.h> defines RELEASE).
#pragma once

#if defined(__clang__)
#define NL_THREAD_ANNOTATION(x) __attribute__((x))
#else
#define NL_THREAD_ANNOTATION(x)
#endif

// A type that is a lock (Mutex): `name` appears in the warnings.
#define NL_CAPABILITY(name) NL_THREAD_ANNOTATION(capability(name))
// An object that holds a lock for its life (MutexLock).
#define NL_SCOPED_CAPABILITY NL_THREAD_ANNOTATION(scoped_lockable)

// A member read or written only with `mu` held.
#define NL_GUARDED_BY(mu) NL_THREAD_ANNOTATION(guarded_by(mu))
// A pointer (or smart pointer) whose pointee is touched only with `mu` held;
// the pointer itself is not guarded.
#define NL_PT_GUARDED_BY(mu) NL_THREAD_ANNOTATION(pt_guarded_by(mu))

// A function called with these locks held (and that leaves them held).
#define NL_REQUIRES(...) NL_THREAD_ANNOTATION(requires_capability(__VA_ARGS__))
// A function called without these locks (it takes them itself).
#define NL_EXCLUDES(...) NL_THREAD_ANNOTATION(locks_excluded(__VA_ARGS__))

// A function that takes the locks (none named: `this`) and returns holding them.
#define NL_ACQUIRE(...) NL_THREAD_ANNOTATION(acquire_capability(__VA_ARGS__))
// A function that releases locks the caller held (none named: `this`).
#define NL_RELEASE(...) NL_THREAD_ANNOTATION(release_capability(__VA_ARGS__))
// A function that takes the lock when it returns `result` (TryLock).
#define NL_TRY_ACQUIRE(...) NL_THREAD_ANNOTATION(try_acquire_capability(__VA_ARGS__))
// A function after which the analysis takes the lock as held (checked at
// run time or not at all: for what the analysis cannot follow).
#define NL_ASSERT_CAPABILITY(x) NL_THREAD_ANNOTATION(assert_capability(x))

// A function the analysis does not look into: every use says why.
#define NL_NO_THREAD_SAFETY_ANALYSIS NL_THREAD_ANNOTATION(no_thread_safety_analysis)
