// A decode step's work shared by helper threads that the step never waits for.
//
// Why: a step is hundreds of short phases (every matrix, every attention pass of every layer). Split
// statically with a barrier after each (OpenMP's ``omp for``), every phase waits for its slowest
// thread, and on a host whose cores are busy with other work one descheduled thread stalls each of
// them for a scheduler slice: one stream kept a third of its speed beside one busy core of two, and
// a twentieth on a busier host.
//
// How: the calling thread (the leader) runs the step and publishes each phase's work as units; any
// helper that is running claims units, so work goes to the threads that run, and a helper that is
// not running holds nothing up. A unit a helper claimed but has not finished after ``patience`` is
// taken over by the leader: helpers write a unit into a private buffer and copy it into place only
// if it is still theirs (a compare-and-swap), so a helper that wakes up late throws its copy away.
// Between steps helpers sleep (a futex), so a helper on a busy core is woken with the scheduler's
// credit for having slept and runs promptly, instead of spinning its share away; the leader never
// waits for one to wake, only, at the step's end, for a helper still inside a unit (it may be
// reading the step's memory). Every unit's arithmetic is the same whoever computes it, so the
// result never depends on the threads, their number or the machine's load.
//
// Each unit's state is (phase generation << 8 | status) in one atomic word; generations only grow,
// so a state from an earlier phase reads as "free" and a helper that fell behind can never claim
// or commit a unit of a later phase.

#pragma once

#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <system_error>
#include <thread>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
inline void cpu_relax() { _mm_pause(); }
#else
inline void cpu_relax() {}
#endif

// NOTE: internal linkage (an unnamed namespace): two loaded builds of this file (another cache
// directory's) must not share one thread's team, as an inline function's static would be shared.
namespace team {
namespace {

constexpr int MAX_UNITS = 256;
constexpr int MAX_HELPERS = 1023;

struct Phase;
using Run = void (*)(const Phase&, int unit, float* out);  // out: a private buffer, or null: in place
using Commit = void (*)(const Phase&, int unit, const float* out);

// One phase: ``units`` units, each run by one thread; ``commit`` copies a unit run into a private
// buffer (at most ``private_floats`` floats) to where ``run`` with null writes it. The arguments are
// plain values and pointers (a helper copies the phase), interpreted by ``run`` and ``commit``.
struct Phase {
    Run run;
    Commit commit;
    int units;
    int per;      // items per unit
    int threads;  // the leader and its helpers in this step (set by ``Team::run``)
    int64_t private_floats;
    const void* ctx;  // constant for the whole step
    const void* ptr[8];
    int64_t num[8];
};

class Team {
  public:
    Team() = default;
    Team(const Team&) = delete;
    Team& operator=(const Team&) = delete;

    ~Team() {
        stop_.store(true);
        step_.fetch_add(1);
        step_.notify_all();
        for (auto& t : threads_) t.join();
    }

    // The leader: a step with ``helpers`` helpers (fewer than asked where threads cannot start).
    void begin(int helpers) {
        helpers = std::min(helpers, MAX_HELPERS);
        while (int(threads_.size()) < helpers) {
            const int me = int(threads_.size());
            try {
                threads_.emplace_back([this, me] { serve(me); });
            } catch (const std::system_error&) {  // NOTE: out of threads: the step runs with fewer
                helpers = me;
            }
        }
        threads_now_ = 1 + helpers;
        active_.store(helpers, std::memory_order_relaxed);
        published_.store(STARTED, std::memory_order_relaxed);
        step_.fetch_add(1, std::memory_order_release);
        if (helpers > 0) step_.notify_all();
    }

    // The leader runs ``phase`` with the helpers' help; every unit is done when it returns.
    void run(const Phase& phase) {
        if (phase.units <= 1 || threads_now_ == 1) {  // NOTE: too little to share, or nobody to
            for (int u = 0; u < phase.units; u++) phase.run(phase, u, nullptr);
            return;
        }
        const uint64_t g = ++gen_;
        Phase& shared = ring_[g % RING];
        shared = phase;
        shared.threads = threads_now_;
        published_.store(g, std::memory_order_release);
        using clock = std::chrono::steady_clock;
        // NOTE: each thread first takes the units of its own share (as a static split would, so
        // a unit's state stays in the cache of the thread that takes it phase after phase), the
        // leader the first; then the leader takes what is left from the end backwards
        const int n = phase.units, own_end = n / threads_now_;
        const auto start = clock::now();
        for (int u = 0; u < own_end; u++)
            if (take(u, g, MAIN)) run_here(phase, u, g);
        // NOTE: a helper's unit is taken over once the leader has waited four times as long as one
        // of its own units took (at least 5 us): a running helper finishes sooner, a descheduled
        // one would hold the phase for a whole scheduler slice
        const auto own = clock::now() - start;
        const auto patience = std::max<clock::duration>(std::chrono::microseconds(5), own_end ? 4 * own / own_end : own);
        const auto waiting = clock::now();
        // NOTE: every unit, the leader's share too: a helper done with its own share goes on to
        // any unit not yet taken, the leader's among them
        for (int first = n - 1; first >= 0;) {
            const bool late = clock::now() - waiting > patience;
            int pending = -1;
            for (int u = first; u >= 0; u--) {
                uint64_t s = state_[u].v.load(std::memory_order_acquire);
                if (s == pack(g, DONE)) continue;
                const bool free = (s >> 8) < g, held = s == pack(g, HELPER);
                if ((free || (held && late)) && state_[u].v.compare_exchange_strong(s, pack(g, MAIN))) {
                    run_here(phase, u, g);
                    continue;
                }
                pending = std::max(pending, u);
            }
            first = pending;
            for (int i = 0; pending >= 0 && i < 16; i++) cpu_relax();  // NOTE: not re-read at once
        }
    }

    // The leader, after its last phase: no helper claims anything more of this step, and none is
    // still inside a unit (reading the step's memory, which the caller may free) when it returns.
    void end() {
        published_.store(IDLE, std::memory_order_seq_cst);
        for (size_t i = 0; i < threads_.size(); i++)
            for (int spins = 0; inside_[i].v.load(std::memory_order_seq_cst); spins++) {
                if (spins < 1000) cpu_relax();
                else sched_yield();
            }
    }

  private:
    enum Status : uint64_t { HELPER = 1, MAIN = 2, COMMIT = 3, DONE = 4 };
    static constexpr int RING = 4;
    static constexpr uint64_t IDLE = ~uint64_t(0);     // no step running
    static constexpr uint64_t STARTED = IDLE - 1;      // a step running, before its first phase
    static constexpr std::chrono::microseconds SPIN{50};

    static uint64_t pack(uint64_t g, Status s) { return g << 8 | s; }

    // Claim unit u for phase g, if no phase-g owner has it yet (a state of an earlier phase is free).
    bool take(int u, uint64_t g, Status who) {
        uint64_t s = state_[u].v.load(std::memory_order_acquire);
        return (s >> 8) < g && state_[u].v.compare_exchange_strong(s, pack(g, who));
    }

    void run_here(const Phase& phase, int u, uint64_t g) {
        phase.run(phase, u, nullptr);
        state_[u].v.store(pack(g, DONE), std::memory_order_release);
    }

    // Helper ``me``'s life: asleep between steps, helping in the steps it is one of the active in.
    void serve(int me) {
        std::vector<float> out;
        uint64_t step = 0;
        for (;;) {
            // NOTE: spin a moment first: the next step often starts within microseconds
            const auto start = std::chrono::steady_clock::now();
            for (int spins = 0; step_.load(std::memory_order_acquire) == step; spins++) {
                if (spins % 64 != 63 || std::chrono::steady_clock::now() - start < SPIN) cpu_relax();
                else step_.wait(step, std::memory_order_acquire);
            }
            if (stop_.load()) return;
            step = step_.load(std::memory_order_acquire);
            if (me < active_.load(std::memory_order_relaxed)) help(me, out, inside_[me].v);
        }
    }

    // A helper's part of one step: claim units of each phase the leader publishes, until ``end``.
    void help(int me, std::vector<float>& out, std::atomic<bool>& inside) {
        uint64_t seen = 0;
        for (;;) {
            const uint64_t g = await_beyond(seen);
            if (g == IDLE) return;
            const Phase phase = ring_[g % RING];
            seen = g;
            // NOTE: as a seqlock's reader: the copy is of phase g unless the leader has moved on
            // meanwhile (it writes phase g's slot again only 4 phases later), then the next is taken
            std::atomic_thread_fence(std::memory_order_acquire);
            if (published_.load(std::memory_order_relaxed) != g) continue;
            if (int64_t(out.size()) < phase.private_floats) out.resize(phase.private_floats);
            // NOTE: its own share first, then onwards (the leader works backwards from the end)
            const int n = phase.units, first = std::min(n, (me + 1) * n / phase.threads);
            inside.store(true, std::memory_order_seq_cst);
            for (int i = 0; i < n && published_.load(std::memory_order_seq_cst) == g; i++) {
                const int u = (first + i) % n;
                if (!take(u, g, HELPER)) continue;
                phase.run(phase, u, out.data());
                uint64_t held = pack(g, HELPER);
                if (state_[u].v.compare_exchange_strong(held, pack(g, COMMIT))) {
                    phase.commit(phase, u, out.data());
                    state_[u].v.store(pack(g, DONE), std::memory_order_release);
                }
            }
            inside.store(false, std::memory_order_release);
        }
    }

    // The first phase published after ``seen`` (or IDLE): spinning for ``SPIN`` (a phase follows
    // the last one within microseconds while the leader runs), then yielding the core to whatever
    // else wants it: the leader itself, when the machine has more threads than cores.
    uint64_t await_beyond(uint64_t seen) {
        const auto start = std::chrono::steady_clock::now();
        for (int spins = 0;; spins++) {
            const uint64_t g = published_.load(std::memory_order_acquire);
            if (g != seen && g != STARTED) return g;
            if (spins % 64 != 63 || std::chrono::steady_clock::now() - start < SPIN) cpu_relax();
            else sched_yield();
        }
    }

    struct alignas(64) Slot {
        std::atomic<uint64_t> v{0};
    };

    struct alignas(64) Flag {
        std::atomic<bool> v{false};
    };

    uint64_t gen_ = 0;       // the leader's count of phases
    int threads_now_ = 1;    // the leader and the helpers of this step
    alignas(64) std::atomic<uint64_t> published_{IDLE};
    alignas(64) std::atomic<uint64_t> step_{0};  // steps begun (helpers sleep on it)
    std::atomic<int> active_{0};
    std::atomic<bool> stop_{false};
    Phase ring_[RING];
    Slot state_[MAX_UNITS];
    std::unique_ptr<Flag[]> inside_{new Flag[MAX_HELPERS]};  // helper i is taking or running units
    std::vector<std::thread> threads_;
};

// The calling thread's team (its helpers live as long as it does).
inline Team& of_this_thread() {
    static thread_local std::unique_ptr<Team> team(new Team());
    return *team;
}

}  // namespace
}  // namespace team
