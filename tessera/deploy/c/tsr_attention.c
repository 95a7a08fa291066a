/* Fused attention for an exported model: tessera's kernel (attention.c, copied in as it
   is, its path picked by CPUID like the GEMM's) and the call the program makes for each
   attention node, its parts (64 query rows of one head) split across the threads. Built
   only into the models that have attention. The tile products need -O3's complete
   unrolling of their register tiles (at -O2 the accumulators stay in memory: 1.2x slower
   than the unfused products in MiniLM). */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("O3")
#endif
#define TSR_ATTN_FORWARD_ONLY
#include "attention.c"
#include "tsr_runtime.h"

static int64_t attention_item(const int64_t* c, int64_t i) {
    const tsr_attention_args* a = (const tsr_attention_args*)(intptr_t)c[0];
    int64_t parts = c[1], n = c[2];
    tsr_attn_t t;
    memset(&t, 0, sizeof t);
    t.nb = a->nb; t.L = a->L; t.S = a->S; t.E = a->E; t.Ev = a->Ev;
    t.q = a->q; t.k = a->k; t.v = a->v; t.mask = a->mask;
    t.qoff = a->qoff; t.koff = a->koff; t.voff = a->voff; t.moff = a->moff;
    t.qrs = a->qrs; t.krs = a->krs; t.vrs = a->vrs; t.mrs = a->mrs; t.mcs = a->mcs;
    t.o = a->o; t.lse = a->lse;
    t.scale = a->scale; t.dscale = 1.0f;
    t.causal = a->causal; t.isa = a->isa;
    if (tsr_attn_fwd_range(&t, parts * i / n, parts * (i + 1) / n) != 0)
        __atomic_store_n((int64_t*)(intptr_t)c[3], 1, __ATOMIC_RELAXED);
    return 0;
}

int tsr_attention_run(const tsr_attention_args* a, int threads) {
    int64_t bad = 0;
    tsr_attn_t t;
    memset(&t, 0, sizeof t);
    t.nb = a->nb; t.L = a->L;
    int64_t parts = tsr_attn_fwd_parts(&t), n = threads < parts ? threads : parts;
    int64_t c[] = {(int64_t)(intptr_t)a, parts, n, (int64_t)(intptr_t)&bad};
    tsr_pool_run(attention_item, c, n, threads);
    return (int)bad;
}
