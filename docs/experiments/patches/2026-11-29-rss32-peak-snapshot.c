/* rss32 (2026-11-29): preloaded in front of coralloc (LD_PRELOAD="this.so libcoralloc.so"),
 * files the resident OS pages of coralloc's segments at each new RSS high (every 1024th
 * malloc/new[]), by kind: segment headers, free slices (owned / abandoned segment; dirty bit;
 * purge due or waiting), pages with live blocks, empty pages; and /proc/self/smaps by kind.
 * Descriptor offsets are those of main 9a03e89 (src/segment/segment.h). Build:
 * gcc -O2 -shared -fPIC -o snap.so this.c -ldl. See 2026-11-29-larson-peak-free-slices.md. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
static void *(*rmalloc)(size_t);
static int statm = -1, busy;
static long best;
static unsigned long cnt;
#define SEG (4ul << 20)
#define MAXS 4096
static uintptr_t segs[MAXS]; static int nsegs;
static long rss_pages(void) {
    char buf[128]; int n = pread(statm, buf, sizeof buf - 1, 0); buf[n] = 0;
    long a, r; sscanf(buf, "%ld %ld", &a, &r); return r;
}
enum { HDR, FREE_OWN, FREE_AB, USED_OWN, USED_AB, EMPTY_OWN, EMPTY_AB, FREE_CLEANBIT, FREE_DUE0, FREE_WAIT, FREE_OVERDUE, NK };
static const char *kn[NK] = {"hdr","free-own","free-aband","used-own","used-aband","empty-own","empty-aband","free-notdirty","free-nodue","free-waiting","free-overdue"};
static long res[NK], live[NK], carved[NK], npg[NK], segres, nseg_own, nseg_ab, snap[NK], slive[NK], scarved[NK], snpg[NK], ssegres, srss, sno, sna, scnt;
static char mb[1 << 20];
#include <time.h>
static uint64_t nowms(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec * 1000ull + t.tv_nsec / 1000000; }
static char sb[1 << 21];
static long o_file, o_anon, o_stack, o_segmap, s_file, s_anon, s_stack, s_segmap; static char biggest[4][160]; static long bigrss[4], sbigrss[4]; static char sbig[4][160];
static void smaps(void) {
    o_file = o_anon = o_stack = o_segmap = 0; memset(bigrss,0,sizeof bigrss);
    int f = open("/proc/self/smaps", O_RDONLY); long n = 0, k; while ((k = read(f, sb + n, sizeof sb - 1 - n)) > 0) n += k; close(f); sb[n] = 0;
    char *hdr = NULL; int cat = 0;
    for (char *l = sb; *l; ) { char *e = strchr(l, '\n'); if (!e) break; *e = 0;
        unsigned long a, b; char perm[8];
        if (sscanf(l, "%lx-%lx %7s", &a, &b, perm) == 3 && strchr(l, '-') == l + strspn(l, "0123456789abcdef")) { hdr = l;
            if (strchr(l, '/')) cat = 0; else if (strstr(l, "[stack")) cat = 2; else if (b - a >= (4ul<<20)) cat = 3; else cat = 1; }
        else if (!strncmp(l, "Rss:", 4)) { long kb = atol(l + 4); if (cat==0) o_file += kb; else if (cat==1) o_anon += kb; else if (cat==2) o_stack += kb; else o_segmap += kb;
            if (cat == 1 || cat == 3) { for (int q = 0; q < 4; q++) if (kb > bigrss[q]) { for (int z = 3; z > q; z--) { bigrss[z] = bigrss[z-1]; memcpy(biggest[z], biggest[z-1], 160);} bigrss[q] = kb; { int ln = strchr(hdr, 10) ? (int)(strchr(hdr, 10) - hdr) : 60; if (ln > 100) ln = 100; snprintf(biggest[q], 160, "%.*s cat%d", ln, hdr, cat); }; break; } } }
        *e = '\n'; l = e + 1; }
}
static void take(long rss) {
    nsegs = 0; memset(res, 0, sizeof res); memset(live, 0, sizeof live); memset(carved, 0, sizeof carved); memset(npg,0,sizeof npg); segres = nseg_own = nseg_ab = 0;
    int (*owns)(const void *) = dlsym(RTLD_DEFAULT, "coral_owns");
    int mf = open("/proc/self/maps", O_RDONLY); int n = 0, k; while ((k = read(mf, mb + n, sizeof mb - 1 - n)) > 0) n += k; close(mf); mb[n] = 0;
    for (char *l = mb; *l; ) { unsigned long a, b; char perm[8]; char *e = strchr(l, '\n'); if (!e) break; *e = 0;
        if (sscanf(l, "%lx-%lx %7s", &a, &b, perm) == 3 && !strchr(l, '/') && !strchr(l, '[') && perm[0] == 'r')
            for (uintptr_t s = (a + SEG - 1) & ~(SEG - 1); s + SEG <= b && nsegs < MAXS; s += SEG) if (owns((void *)(s + 65536))) segs[nsegs++] = s;
        *e = '\n'; l = e + 1; }
    int pm = open("/proc/self/pagemap", O_RDONLY);
    for (int i = 0; i < nsegs; i++) {
        static uint64_t e[1024]; uint8_t *seg = (uint8_t *)segs[i];
        pread(pm, e, sizeof e, segs[i] / 4096 * 8);
        int ab = *(volatile uintptr_t *)seg == 0; uint64_t dirty = *(volatile uint64_t *)(seg + 32); uint64_t due = *(volatile uint64_t *)(seg + 48);
        for (int sl = 0; sl < 64; sl++) {
            int r = 0; for (int q = 0; q < 16; q++) r += (e[sl * 16 + q] >> 63) & 1;
            segres += r;
            uint8_t *d = seg + 128 + 128 * sl;
            uint16_t soff = *(uint16_t *)(d + 116);
            uint8_t *h = d - soff;
            uint16_t scount = *(uint16_t *)(h + 118);
            if (sl == 0) { res[HDR] += r; continue; }
            if (scount == 0) { if (ab < 0) { /* decide by any page */ } }
            void *owner = *(void **)(h + 72);
            if (scount && ab < 0) ab = owner == NULL;
            if (!r && scount == 0) continue;
            if (scount == 0) { res[ab == 1 ? FREE_AB : FREE_OWN] += r; if (!((dirty >> sl) & 1)) res[FREE_CLEANBIT] += r; else if (!due) res[FREE_DUE0] += r; else if (due > nowms()) res[FREE_WAIT] += r; else res[FREE_OVERDUE] += r; continue; }
            uint32_t used = *(uint32_t *)(h + 16), cap = *(uint32_t *)(h + 20);
            uintptr_t tf = *(volatile uintptr_t *)(h + 64);
            uint32_t tfc = (tf >> 48) & 0xfff;
            size_t bs = *(size_t *)(h + 96);
            int kk = owner ? (used > tfc ? USED_OWN : EMPTY_OWN) : (used > tfc ? USED_AB : EMPTY_AB);
            res[kk] += r;
            if (soff == 0) { npg[kk]++; live[kk] += (long)(used > tfc ? used - tfc : 0) * bs; carved[kk] += (long)cap * bs; }
        }
        if (ab == 1) nseg_ab++; else nseg_own++;
    }
    close(pm);
    smaps(); s_file=o_file; s_anon=o_anon; s_stack=o_stack; s_segmap=o_segmap; memcpy(sbig,biggest,sizeof sbig); memcpy(sbigrss,bigrss,sizeof bigrss);
    memcpy(snap, res, sizeof res); memcpy(slive, live, sizeof live); memcpy(scarved, carved, sizeof carved); memcpy(snpg,npg,sizeof npg); ssegres = segres; srss = rss; sno = nseg_own; sna = nseg_ab; scnt = cnt;
    if (getenv("SNAPLOG")) { fprintf(stderr, "cnt %lu rss %ld seg %ld (own %ld ab %ld):", cnt, rss*4, segres*4, nseg_own, nseg_ab); for (int q=0;q<NK;q++) fprintf(stderr, " %s %ld", kn[q], res[q]*4); fprintf(stderr, "\n"); }
}
static void check(void) { long r = rss_pages(); if (r > best) { best = r; busy = 1; take(r); busy = 0; } }
void *malloc(size_t n) {
    if (!rmalloc) { rmalloc = dlsym(RTLD_NEXT, "malloc"); statm = open("/proc/self/statm", O_RDONLY); }
    if (!busy && ((__atomic_add_fetch(&cnt, 1, __ATOMIC_RELAXED) & 1023) == 0)) { if (!__atomic_exchange_n(&busy, 1, __ATOMIC_ACQUIRE)) { long r = rss_pages(); if (r > best + 64) { best = r; take(r); } __atomic_store_n(&busy, 0, __ATOMIC_RELEASE); } }
    return rmalloc(n);
}
__attribute__((destructor)) static void out(void) {
    fprintf(stderr, "peak snapshot at malloc %ld: rss %ld KiB, in segments %ld KiB (segments own %ld, abandoned %ld)\n", scnt, srss * 4, ssegres * 4, sno, sna);
    fprintf(stderr, "smaps: file %ld anon-small %ld stack %ld anon-big(>=4M maps) %ld\n", s_file, s_anon, s_stack, s_segmap);
    for (int q = 0; q < 4; q++) fprintf(stderr, "  big %ld KiB: %s\n", sbigrss[q], sbig[q]);
    for (int q = 0; q < NK; q++) fprintf(stderr, "  %-12s res %7ld KiB pages %5ld live %7ld KiB carved %7ld KiB\n", kn[q], snap[q]*4, snpg[q], slive[q]/1024, scarved[q]/1024);
}
static void *(*rnam)(size_t);
static void hook(void) { if (statm < 0) statm = open("/proc/self/statm", O_RDONLY); if (!busy && ((__atomic_add_fetch(&cnt, 1, __ATOMIC_RELAXED) & 1023) == 0)) { if (!__atomic_exchange_n(&busy, 1, __ATOMIC_ACQUIRE)) { long r = rss_pages(); if (r > best + 64) { best = r; take(r); } __atomic_store_n(&busy, 0, __ATOMIC_RELEASE); } } }
void *_Znam(size_t n) { if (!rnam) rnam = dlsym(RTLD_NEXT, "_Znam"); hook(); return rnam(n); }
