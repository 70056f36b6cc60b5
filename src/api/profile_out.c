/* The heap profiler's output: the profile in the pprof format
 * (profile.proto, uncompressed: pprof reads it so), and the leak report.
 *
 * Both run at exit, on coral_profile_dump and in a signal handler, so
 * neither allocates through malloc: every buffer is mapped with
 * coral_os_map, files are read with open/read/mmap. The program's own
 * symbols name the frames: the mapped files' ELF symbol tables (.symtab,
 * else .dynsym), read from disk, give each location a function, so pprof
 * and `coralloc profile` need no binary; each mapping carries its file's
 * GNU build ID, so pprof can find the binary again for line numbers.
 *
 * The protobuf encoding is written here from the format's definition:
 * varints, keys (field << 3 | wire type), length-delimited submessages
 * built in a scratch buffer and copied in. Fields at their zero value are
 * left out, as proto3 does. */
#define _GNU_SOURCE
#include <elf.h>
#include <errno.h>
#include <fcntl.h>
#include <link.h>
#include <sys/auxv.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "api/profile.h"

/* ---- the dump's memory: bump allocation in mapped chunks ---------------------------
 * A dump (or leak report) takes all its memory from one arena: a chunk
 * mapped on first use (more only for a large profile), every chunk unmapped
 * at the end. So a dump costs two system calls and the pages it touches,
 * however many buffers it uses (a mapping per buffer cost a short process
 * more than its allocations did). Memory is never given back before the
 * end: a buffer that grows moves to the top of the arena, or grows in
 * place when it is the top one already. */

#define ARENA_CHUNK ((size_t)1 << 20) /* reserved, not committed: only touched pages count */

typedef struct arena_chunk_s {
    struct arena_chunk_s *prev;
    size_t size;
} arena_chunk_t; /* at the start of each chunk (16 bytes: what follows stays aligned) */

typedef struct arena_s {
    uint8_t *top, *end; /* the newest chunk's free part */
    arena_chunk_t *last;
} arena_t;

/* size bytes (16-aligned, zero: chunks come zeroed and are never reused),
 * or NULL when no chunk can be mapped. */
static void *arena_take(arena_t *a, size_t size) {
    size = (size + 15) & ~(size_t)15;
    if ((size_t)(a->end - a->top) < size) {
        size_t want = size + sizeof(arena_chunk_t);
        size_t csize = want <= ARENA_CHUNK
                           ? ARENA_CHUNK
                           : (want + CORAL_OS_PAGE_SIZE - 1) & ~(size_t)(CORAL_OS_PAGE_SIZE - 1);
        arena_chunk_t *c = coral_os_map(csize);
        if (c == NULL) return NULL;
        *c = (arena_chunk_t){a->last, csize};
        a->last = c;
        a->top = (uint8_t *)(c + 1);
        a->end = (uint8_t *)c + csize;
    }
    void *p = a->top;
    a->top += size;
    return p;
}

static void arena_done(arena_t *a) {
    while (a->last != NULL) {
        arena_chunk_t *c = a->last;
        a->last = c->prev;
        coral_os_unmap(c, c->size);
    }
    *a = (arena_t){0};
}

/* ---- growable buffers, in the arena ----------------------------------------------- */

typedef struct buf_s {
    uint8_t *p;
    size_t len, cap;
    bool failed; /* no memory: the output is incomplete */
    arena_t *arena;
} buf_t;

/* A buffer's first room: small, so that the dozen buffers of a short
 * process's profile share a page or two of the arena (each page touched is
 * a fault: with 4 KiB each, a page a buffer); a buffer that grows doubles. */
#define BUF_FIRST 256

static buf_t buf_in(arena_t *a) { return (buf_t){.arena = a}; }

static bool buf_reserve(buf_t *b, size_t more) {
    if (b->len + more <= b->cap) return true;
    if (b->failed) return false;
    size_t cap = b->cap ? b->cap : BUF_FIRST;
    while (cap < b->len + more) cap *= 2;
    arena_t *a = b->arena;
    if (b->p != NULL && b->p + b->cap == a->top && (size_t)(a->end - b->p) >= cap) {
        a->top = b->p + cap; /* the top buffer: grows in place */
        b->cap = cap;
        return true;
    }
    uint8_t *p = arena_take(a, cap);
    if (p == NULL) {
        b->failed = true;
        return false;
    }
    if (b->len) memcpy(p, b->p, b->len);
    b->p = p;
    b->cap = cap;
    return true;
}

static void buf_put(buf_t *b, const void *d, size_t n) {
    if (!buf_reserve(b, n)) return;
    memcpy(b->p + b->len, d, n);
    b->len += n;
}

/* Room for n items of size each, zeroed; their index is returned through
 * *first (the buffer may move: items are reached by index). */
static void *buf_grow(buf_t *b, size_t size, size_t n) {
    if (!buf_reserve(b, size * n)) return NULL;
    void *p = b->p + b->len;
    memset(p, 0, size * n);
    b->len += size * n;
    return p;
}

/* ---- protobuf encoding ------------------------------------------------------------ */

enum { WIRE_VARINT = 0, WIRE_BYTES = 2 };

static void pb_varint(buf_t *b, uint64_t v) {
    uint8_t tmp[10];
    size_t n = 0;
    while (v >= 0x80) {
        tmp[n++] = (uint8_t)(v | 0x80);
        v >>= 7;
    }
    tmp[n++] = (uint8_t)v;
    buf_put(b, tmp, n);
}

static void pb_key(buf_t *b, unsigned field, unsigned wire) {
    pb_varint(b, (uint64_t)field << 3 | wire);
}

/* An int64 or uint64 field (negative int64s take ten bytes, as protobuf's). */
static void pb_uint(buf_t *b, unsigned field, uint64_t v) {
    if (v == 0) return;
    pb_key(b, field, WIRE_VARINT);
    pb_varint(b, v);
}

static void pb_bytes(buf_t *b, unsigned field, const void *d, size_t n) {
    pb_key(b, field, WIRE_BYTES);
    pb_varint(b, n);
    buf_put(b, d, n);
}

/* The submessage built in sub, as field of b; sub emptied. */
static void pb_message(buf_t *b, unsigned field, buf_t *sub) {
    pb_bytes(b, field, sub->p, sub->len);
    sub->len = 0;
}

/* ---- /proc/self/maps ---------------------------------------------------------------- */

typedef struct mapping_s {
    uintptr_t start, end, offset;
    const char *path; /* into the maps text; "" for anonymous */
    size_t path_len;
    bool exec;
    int file;    /* index in the symbolizer's files, or -1 */
    uint64_t id; /* in the profile, from 1; 0: not written */
    bool has_functions;
    bool used;   /* a location lies in it: written (the program's is, always) */
    bool is_exe; /* of the program's own file (/proc/self/exe) */
} mapping_t;

/* The whole of a file that stat cannot size (/proc), into b. */
static bool read_all(const char *path, buf_t *b) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return false;
    for (;;) {
        if (!buf_reserve(b, 16384)) break;
        ssize_t n = read(fd, b->p + b->len, b->cap - b->len);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        b->len += (size_t)n;
    }
    close(fd);
    return !b->failed;
}

static uintptr_t parse_hex(const char **s) {
    uintptr_t v = 0;
    for (;; (*s)++) {
        char c = **s;
        unsigned d = c >= '0' && c <= '9'   ? (unsigned)(c - '0')
                     : c >= 'a' && c <= 'f' ? (unsigned)(c - 'a' + 10)
                                            : 16u;
        if (d == 16) return v;
        v = v * 16 + d;
    }
}

static const char *skip_field(const char *s, const char *end) {
    while (s < end && *s != ' ') s++;
    while (s < end && *s == ' ') s++;
    return s;
}

/* "start-end perms offset dev inode   path" per line, into out. */
static void maps_parse(const buf_t *text, buf_t *out) {
    const char *s = (const char *)text->p, *end = s + text->len;
    while (s < end) {
        const char *eol = memchr(s, '\n', (size_t)(end - s));
        if (eol == NULL) eol = end;
        mapping_t m = {.file = -1, .path = ""};
        m.start = parse_hex(&s);
        if (*s == '-') s++;
        m.end = parse_hex(&s);
        s = skip_field(s, eol);
        m.exec = s + 2 < eol && s[2] == 'x';
        s = skip_field(s, eol);
        m.offset = parse_hex(&s);
        s = skip_field(s, eol); /* to dev */
        s = skip_field(s, eol); /* to inode */
        s = skip_field(s, eol); /* to the path */
        m.path = s;
        m.path_len = (size_t)(eol - s);
        buf_put(out, &m, sizeof m);
        s = eol + 1;
    }
}

/* ---- ELF files: symbols and build IDs ---------------------------------------------------- */

typedef struct elf_file_s {
    const char *path;
    size_t path_len;
    const uint8_t *data; /* the file, mapped (NULL: unreadable) */
    size_t size;
    const Elf64_Phdr *ph;
    size_t phnum;
    const Elf64_Sym *syms;
    size_t nsyms;
    const char *strtab;
    size_t strsz;
    char build_id[2 * 64 + 1]; /* hex; "" if none */
} elf_file_t;

static bool in_file(const elf_file_t *f, uint64_t off, uint64_t len) {
    return off <= f->size && len <= f->size - off;
}

static void elf_build_id(elf_file_t *f) {
    static const char hex[] = "0123456789abcdef";
    for (size_t i = 0; i < f->phnum; i++) {
        const Elf64_Phdr *p = &f->ph[i];
        if (p->p_type != PT_NOTE || !in_file(f, p->p_offset, p->p_filesz)) continue;
        const uint8_t *n = f->data + p->p_offset, *end = n + p->p_filesz;
        while (n + sizeof(Elf64_Nhdr) <= end) {
            const Elf64_Nhdr *h = (const Elf64_Nhdr *)n;
            size_t name = (h->n_namesz + 3) & ~3u, desc = (h->n_descsz + 3) & ~3u;
            const uint8_t *d = n + sizeof *h + name;
            if (d + desc > end) break;
            if (h->n_type == NT_GNU_BUILD_ID && h->n_namesz == 4 &&
                memcmp(n + sizeof *h, "GNU", 4) == 0 && h->n_descsz <= 64) {
                for (size_t k = 0; k < h->n_descsz; k++) {
                    f->build_id[2 * k] = hex[d[k] >> 4];
                    f->build_id[2 * k + 1] = hex[d[k] & 15];
                }
                f->build_id[2 * h->n_descsz] = '\0';
                return;
            }
            n = d + desc;
        }
    }
}

/* The symbol table (.symtab, else .dynsym) and program headers of a
 * 64-bit ELF file, each checked to lie inside it. */
static void elf_open(elf_file_t *f) {
    char path[4096];
    if (f->path_len >= sizeof path) return;
    memcpy(path, f->path, f->path_len);
    path[f->path_len] = '\0';
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return;
    struct stat st;
    void *data = MAP_FAILED;
    if (fstat(fd, &st) == 0 && st.st_size >= (off_t)sizeof(Elf64_Ehdr))
        data = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (data == MAP_FAILED) return;
    f->data = data;
    f->size = (size_t)st.st_size;
    const Elf64_Ehdr *eh = data;
    if (memcmp(eh->e_ident, ELFMAG, SELFMAG) != 0 || eh->e_ident[EI_CLASS] != ELFCLASS64) return;
    if (eh->e_phentsize == sizeof(Elf64_Phdr) &&
        in_file(f, eh->e_phoff, (uint64_t)eh->e_phnum * sizeof(Elf64_Phdr))) {
        f->ph = (const Elf64_Phdr *)(f->data + eh->e_phoff);
        f->phnum = eh->e_phnum;
    }
    elf_build_id(f);
    if (eh->e_shentsize != sizeof(Elf64_Shdr) ||
        !in_file(f, eh->e_shoff, (uint64_t)eh->e_shnum * sizeof(Elf64_Shdr)))
        return;
    const Elf64_Shdr *sh = (const Elf64_Shdr *)(f->data + eh->e_shoff);
    for (unsigned want = SHT_SYMTAB;; want = SHT_DYNSYM) {
        for (size_t i = 0; i < eh->e_shnum; i++) {
            if (sh[i].sh_type != want || sh[i].sh_link >= eh->e_shnum) continue;
            const Elf64_Shdr *str = &sh[sh[i].sh_link];
            if (!in_file(f, sh[i].sh_offset, sh[i].sh_size) ||
                !in_file(f, str->sh_offset, str->sh_size))
                continue;
            f->syms = (const Elf64_Sym *)(f->data + sh[i].sh_offset);
            f->nsyms = sh[i].sh_size / sizeof(Elf64_Sym);
            f->strtab = (const char *)(f->data + str->sh_offset);
            f->strsz = str->sh_size;
            return;
        }
        if (want == SHT_DYNSYM) return;
    }
}

/* The function holding file offset off (NULL: none known); its name's
 * length in *len. */
static const char *elf_function_at(const elf_file_t *f, uint64_t off, size_t *len) {
    uint64_t vaddr = UINT64_MAX;
    for (size_t i = 0; i < f->phnum; i++) {
        const Elf64_Phdr *p = &f->ph[i];
        if (p->p_type == PT_LOAD && off >= p->p_offset && off - p->p_offset < p->p_filesz)
            vaddr = off - p->p_offset + p->p_vaddr;
    }
    if (vaddr == UINT64_MAX || f->syms == NULL) return NULL;
    const Elf64_Sym *best = NULL;
    for (size_t i = 0; i < f->nsyms; i++) {
        const Elf64_Sym *s = &f->syms[i];
        /* The range first (one subtraction: below st_value it wraps to a
         * huge distance), the symbol's kind only for the few that hold
         * vaddr: the test most symbols fail, made first. */
        if (vaddr - s->st_value >= (s->st_size ? s->st_size : 1)) continue;
        unsigned type = ELF64_ST_TYPE(s->st_info);
        if ((type != STT_FUNC && type != STT_GNU_IFUNC) || s->st_shndx == SHN_UNDEF ||
            s->st_name >= f->strsz)
            continue;
        best = s;
        break;
    }
    if (best == NULL) return NULL;
    const char *name = f->strtab + best->st_name;
    *len = strnlen(name, f->strsz - best->st_name);
    return *len ? name : NULL;
}

/* ---- the symbolizer: mappings and their files ------------------------------------------ */

#define MAX_FILES 1024

typedef struct symbolizer_s {
    buf_t maps_text, maps; /* mapping_t */
    size_t nmaps;
    buf_t files; /* elf_file_t */
    size_t nfiles;
    /* The library's own file (its frames lead every stack), when it is not
     * the program's: those leading frames are left out. */
    const char *self_path;
    size_t self_len;
} symbolizer_t;

static mapping_t *map_at(symbolizer_t *z, size_t i) { return &((mapping_t *)z->maps.p)[i]; }
static elf_file_t *file_at(symbolizer_t *z, int i) { return &((elf_file_t *)z->files.p)[i]; }

static bool same_path(const char *a, size_t alen, const char *b, size_t blen) {
    return alen == blen && memcmp(a, b, alen) == 0;
}

/* The file of mapping m, opened once per path. */
static elf_file_t *file_of(symbolizer_t *z, mapping_t *m) {
    if (m->file >= 0) return file_at(z, m->file);
    if (m->path_len == 0 || m->path[0] != '/') return NULL;
    for (size_t i = 0; i < z->nfiles; i++) {
        if (same_path(file_at(z, (int)i)->path, file_at(z, (int)i)->path_len, m->path,
                      m->path_len)) {
            m->file = (int)i;
            return file_at(z, m->file);
        }
    }
    if (z->nfiles >= MAX_FILES) return NULL;
    elf_file_t *f = buf_grow(&z->files, sizeof *f, 1);
    if (f == NULL) return NULL;
    f->path = m->path;
    f->path_len = m->path_len;
    elf_open(f);
    m->file = (int)z->nfiles++;
    return f;
}

static mapping_t *mapping_of(symbolizer_t *z, uintptr_t addr) {
    for (size_t i = 0; i < z->nmaps; i++) {
        mapping_t *m = map_at(z, i);
        if (addr >= m->start && addr < m->end) return m;
    }
    return NULL;
}

/* No mapping known yet (what a dump with no sample keeps). */
static void symbolizer_clear(symbolizer_t *z, arena_t *a) {
    *z = (symbolizer_t){.maps_text = buf_in(a), .maps = buf_in(a), .files = buf_in(a)};
}

/* ---- the mappings of code from the loader's list (at exit) ---------------------------
 * The exit handler's write, most often a short process's, takes the
 * mappings of code from dl_iterate_phdr, with no system call, rather than
 * from /proc/self/maps (its read cost a sampled short process about 40-60
 * us of its ~0.4 ms write). The loader's list is not for a signal
 * handler (dl_iterate_phdr takes the loader's lock), so only the exit
 * handler uses it; and it only when it gives what the maps would: every
 * object named by an absolute path, and every return address of every
 * site inside an executable segment of one (a JIT's code or a stray word
 * of a stack is in none: then the maps are read, as always, so stacks are
 * cut where they would be). Each executable PT_LOAD segment is a mapping,
 * the page range the kernel maps for it. */

typedef struct loaded_look_s {
    buf_t *out;
    const char *exe; /* the program's path (its object's dlpi_name is "") */
    size_t exe_len;
    uintptr_t vdso, page;
    bool unnamed; /* an object with no absolute path: use the maps */
} loaded_look_t;

static int loaded_object(struct dl_phdr_info *info, size_t size, void *arg) {
    (void)size;
    loaded_look_t *look = arg;
    const char *name = info->dlpi_name != NULL ? info->dlpi_name : "";
    size_t len = strlen(name);
    bool is_exe = false;
    if (look->vdso != 0 && info->dlpi_addr == look->vdso) {
        name = "[vdso]";
        len = 6;
    } else if (len == 0) {
        name = look->exe;
        len = look->exe_len;
        is_exe = true;
    } else if (name[0] != '/') {
        look->unnamed = true;
    }
    for (size_t i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        if (ph->p_type != PT_LOAD || !(ph->p_flags & PF_X)) continue;
        uintptr_t lo = info->dlpi_addr + ph->p_vaddr;
        mapping_t m = {.start = lo & ~(look->page - 1),
                       .end = (lo + ph->p_memsz + look->page - 1) & ~(look->page - 1),
                       .offset = ph->p_offset & ~(uintptr_t)(look->page - 1),
                       .path = name,
                       .path_len = len,
                       .exec = true,
                       .file = -1,
                       .is_exe = is_exe};
        buf_put(look->out, &m, sizeof m);
    }
    return 0;
}

/* The mappings of code from the loader's list; false where they would
 * not give what the maps give (above). */
static bool loaded_mappings(symbolizer_t *z, const char *exe, size_t exe_len) {
    long page = sysconf(_SC_PAGESIZE);
    loaded_look_t look = {.out = &z->maps,
                          .exe = exe,
                          .exe_len = exe_len,
                          .vdso = (uintptr_t)getauxval(AT_SYSINFO_EHDR),
                          .page = page > 0 ? (uintptr_t)page : 4096};
    dl_iterate_phdr(loaded_object, &look);
    z->nmaps = z->maps.len / sizeof(mapping_t);
    return !look.unnamed && !z->maps.failed && z->nmaps != 0;
}

/* Every return address of every site (and the call before it) in a
 * mapping. */
static bool sites_mapped(symbolizer_t *z, const coral_profile_site_t *sites, size_t n) {
    for (size_t k = 0; k < n; k++)
        for (uint32_t i = 0; i < sites[k].depth; i++)
            if (mapping_of(z, sites[k].pcs[i]) == NULL ||
                mapping_of(z, sites[k].pcs[i] - 1) == NULL)
                return false;
    return true;
}

/* The mappings (and the program's and the library's own): from the
 * loader's list when from_loader and the sites' addresses all lie in
 * them, else from /proc/self/maps. */
static void symbolizer_init(symbolizer_t *z, arena_t *a, bool from_loader,
                            const coral_profile_site_t *sites, size_t nsites) {
    symbolizer_clear(z, a);
    char *exe = arena_take(a, 4096);
    ssize_t n = exe != NULL ? readlink("/proc/self/exe", exe, 4096) : -1;
    if (n < 0 || n >= 4096) n = 0;
    if (!(from_loader && n > 0 && loaded_mappings(z, exe, (size_t)n) &&
          sites_mapped(z, sites, nsites))) {
        z->maps.len = 0;
        read_all("/proc/self/maps", &z->maps_text);
        maps_parse(&z->maps_text, &z->maps);
        z->nmaps = z->maps.len / sizeof(mapping_t);
        for (size_t i = 0; i < z->nmaps && n > 0; i++)
            map_at(z, i)->is_exe =
                same_path(map_at(z, i)->path, map_at(z, i)->path_len, exe, (size_t)n);
    }
    mapping_t *self = mapping_of(z, (uintptr_t)&coral_profile_write);
    if (self != NULL && n > 0 && !same_path(self->path, self->path_len, exe, (size_t)n)) {
        z->self_path = self->path;
        z->self_len = self->path_len;
    }
}

static void symbolizer_done(symbolizer_t *z) {
    for (size_t i = 0; i < z->nfiles; i++)
        if (file_at(z, (int)i)->data != NULL)
            munmap((void *)file_at(z, (int)i)->data, file_at(z, (int)i)->size);
}

/* The frames of a site from the program's side: the library's own
 * leading frames (sampler, slow paths, malloc) skipped. */
static uint32_t first_program_frame(symbolizer_t *z, const coral_profile_site_t *s) {
    uint32_t i = 0;
    while (i < s->depth && z->self_path != NULL) {
        mapping_t *m = mapping_of(z, s->pcs[i]);
        if (m == NULL || !same_path(m->path, m->path_len, z->self_path, z->self_len)) break;
        i++;
    }
    return i;
}

/* Where the site's stack stops being trustworthy: the first frame after
 * `first` whose return address lies in no executable mapping. The walk
 * follows frame pointers, and a function built without them leaves its
 * caller's frame pointer as whatever word was there: the next "return
 * address" is then a stray word of the stack, and so is everything past
 * it. (The first frame, the caller of malloc, stays whatever it is.) */
static uint32_t program_frames_end(symbolizer_t *z, const coral_profile_site_t *s, uint32_t first) {
    for (uint32_t i = first + 1; i < s->depth; i++) {
        mapping_t *m = mapping_of(z, s->pcs[i] - 1);
        if (m == NULL || !m->exec) return i;
    }
    return s->depth;
}

/* The function at addr (an instruction address), or NULL. */
static const char *function_at(symbolizer_t *z, uintptr_t addr, mapping_t **mp, size_t *len) {
    mapping_t *m = mapping_of(z, addr);
    *mp = m;
    if (m == NULL) return NULL;
    elf_file_t *f = file_of(z, m);
    if (f == NULL || f->data == NULL) return NULL;
    return elf_function_at(f, addr - m->start + m->offset, len);
}

/* ---- collecting the sites ----------------------------------------------------------- */

typedef struct sites_s {
    buf_t list; /* coral_profile_site_t */
    size_t n;
} sites_t;

static void site_collect(const coral_profile_site_t *site, void *arg) {
    sites_t *s = arg;
    coral_profile_site_t *copy = buf_grow(&s->list, sizeof *copy, 1);
    if (copy == NULL) return;
    *copy = *site;
    s->n++;
}

static coral_profile_site_t *site_at(sites_t *s, size_t i) {
    return &((coral_profile_site_t *)s->list.p)[i];
}

static int64_t rounded(double x) { return x > 0 ? (int64_t)(x + 0.5) : 0; }

/* ---- the string table and the id maps ---------------------------------------------- */

typedef struct string_ref_s {
    const char *s;
    size_t len;
} string_ref_t;

/* Open addressing, keys never 0: key -> value. */
typedef struct table_s {
    buf_t slots; /* 2 x uint64 each */
    size_t cap;
} table_t;

static bool table_init(table_t *t, size_t want, arena_t *a) {
    t->cap = 64;
    while (t->cap < 2 * want) t->cap *= 2;
    t->slots = buf_in(a);
    return buf_grow(&t->slots, 16, t->cap) != NULL;
}

/* The slot of key: its value, 0 if new (the caller stores one). */
static uint64_t *table_slot(table_t *t, uint64_t key) {
    uint64_t *s = (uint64_t *)t->slots.p;
    size_t i = (size_t)((key * 0x9E3779B97F4A7C15ull) >> 20) & (t->cap - 1);
    while (s[2 * i] != 0 && s[2 * i] != key) i = (i + 1) & (t->cap - 1);
    s[2 * i] = key;
    return &s[2 * i + 1];
}

typedef struct writer_s {
    symbolizer_t z;
    sites_t sites;
    buf_t strings; /* string_ref_t */
    size_t nstrings;
    table_t string_ids; /* hash of the text -> index + 1 */
    table_t loc_ids;    /* address -> location id */
    table_t func_ids;   /* string index + 1 -> function id */
    buf_t out, sub, sub2;
    uint64_t nlocs, nfuncs;
} writer_t;

static uint64_t text_hash(const char *s, size_t len) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < len; i++) h = (h ^ (uint8_t)s[i]) * 0x100000001b3ull;
    return h | 1;
}

/* The index of a string in the table (added if new). Collisions of the
 * 64-bit hash are checked: a different text probes on. */
static int64_t string_id(writer_t *w, const char *s, size_t len) {
    uint64_t h = text_hash(s, len);
    for (;; h += 2) {
        uint64_t *slot = table_slot(&w->string_ids, h);
        if (*slot != 0) {
            string_ref_t *r = &((string_ref_t *)w->strings.p)[*slot - 1];
            if (same_path(r->s, r->len, s, len)) return (int64_t)*slot - 1;
            continue;
        }
        string_ref_t *r = buf_grow(&w->strings, sizeof *r, 1);
        if (r == NULL) return 0;
        *r = (string_ref_t){s, len};
        *slot = ++w->nstrings;
        return (int64_t)*slot - 1;
    }
}

static int64_t cstring_id(writer_t *w, const char *s) { return string_id(w, s, strlen(s)); }

/* ---- the profile message -------------------------------------------------------------- */

/* Profile fields (profile.proto). */
enum {
    P_SAMPLE_TYPE = 1,
    P_SAMPLE = 2,
    P_MAPPING = 3,
    P_LOCATION = 4,
    P_FUNCTION = 5,
    P_STRING_TABLE = 6,
    P_TIME_NANOS = 9,
    P_PERIOD_TYPE = 11,
    P_PERIOD = 12,
    P_COMMENT = 13,
    P_DEFAULT_SAMPLE_TYPE = 14,
};

static void value_type(writer_t *w, unsigned field, const char *type, const char *unit) {
    pb_uint(&w->sub, 1, (uint64_t)cstring_id(w, type));
    pb_uint(&w->sub, 2, (uint64_t)cstring_id(w, unit));
    pb_message(&w->out, field, &w->sub);
}

/* The function id of a name (a Function message written when new). */
static uint64_t function_id(writer_t *w, const char *name, size_t len) {
    int64_t sid = string_id(w, name, len);
    uint64_t *slot = table_slot(&w->func_ids, (uint64_t)sid + 1);
    if (*slot != 0) return *slot;
    *slot = ++w->nfuncs;
    pb_uint(&w->sub2, 1, *slot);
    pb_uint(&w->sub2, 2, (uint64_t)sid); /* name */
    pb_uint(&w->sub2, 3, (uint64_t)sid); /* system_name */
    pb_message(&w->out, P_FUNCTION, &w->sub2);
    return *slot;
}

/* The location id of a return address (a Location, and its Function,
 * written when new). The address written is the call's, one byte before. */
static uint64_t location_id(writer_t *w, uintptr_t ret) {
    uintptr_t addr = ret - 1;
    uint64_t *slot = table_slot(&w->loc_ids, addr);
    if (*slot != 0) return *slot;
    uint64_t id = *slot = ++w->nlocs;
    mapping_t *m;
    size_t len = 0;
    const char *name = function_at(&w->z, addr, &m, &len);
    uint64_t func = name != NULL ? function_id(w, name, len) : 0;
    if (m != NULL && name != NULL) m->has_functions = true;
    if (m != NULL) m->used = true;
    pb_uint(&w->sub, 1, id);
    if (m != NULL) pb_uint(&w->sub, 2, m->id);
    pb_uint(&w->sub, 3, addr);
    if (func != 0) {
        pb_uint(&w->sub2, 1, func);
        pb_message(&w->sub, 4, &w->sub2);
    }
    pb_message(&w->out, P_LOCATION, &w->sub);
    return id;
}

/* Mappings of code: the program's file first (pprof takes the first
 * mapping for the main binary), then the others, ids from 1. Written (and
 * their files opened, for the build ID) are the program's and those a
 * location lies in. */
static void mapping_ids(writer_t *w) {
    if (w->z.nmaps == 0) return; /* no sample: no mapping read */
    uint64_t next = 1;
    for (int pass = 0; pass < 2; pass++) {
        for (size_t i = 0; i < w->z.nmaps; i++) {
            mapping_t *m = map_at(&w->z, i);
            if (!m->exec || m->id != 0) continue;
            if (pass == 0 && !m->is_exe) continue;
            m->id = next++;
            m->used = m->is_exe;
        }
    }
}

static void write_mappings(writer_t *w) {
    uint64_t count = 0;
    for (size_t i = 0; i < w->z.nmaps; i++) count += map_at(&w->z, i)->id != 0;
    for (uint64_t id = 1; id <= count; id++) {
        for (size_t i = 0; i < w->z.nmaps; i++) {
            mapping_t *m = map_at(&w->z, i);
            if (m->id != id || !m->used) continue; /* (no location: its file not opened) */
            elf_file_t *f = file_of(&w->z, m);
            pb_uint(&w->sub, 1, m->id);
            pb_uint(&w->sub, 2, m->start);
            pb_uint(&w->sub, 3, m->end);
            pb_uint(&w->sub, 4, m->offset);
            pb_uint(&w->sub, 5, (uint64_t)string_id(w, m->path, m->path_len));
            if (f != NULL && f->build_id[0] != '\0')
                pb_uint(&w->sub, 6, (uint64_t)cstring_id(w, f->build_id));
            pb_uint(&w->sub, 7, m->has_functions);
            pb_message(&w->out, P_MAPPING, &w->sub);
        }
    }
}

static void write_sample(writer_t *w, const coral_profile_site_t *s) {
    uint32_t first = first_program_frame(&w->z, s), end = program_frames_end(&w->z, s, first);
    uint64_t locs[CORAL_PROFILE_DEPTH];
    uint32_t n = 0; /* (each location_id writes its Location first, with sub and sub2) */
    for (uint32_t i = first; i < end; i++) locs[n++] = location_id(w, s->pcs[i]);
    for (uint32_t i = 0; i < n; i++) pb_varint(&w->sub2, locs[i]);
    pb_message(&w->sub, 1, &w->sub2); /* location_id, packed */
    int64_t values[4] = {rounded(s->alloc_objects), rounded(s->alloc_bytes),
                         rounded(s->inuse_objects), rounded(s->inuse_bytes)};
    for (int i = 0; i < 4; i++) pb_varint(&w->sub2, (uint64_t)values[i]);
    pb_message(&w->sub, 2, &w->sub2); /* value, packed */
    pb_message(&w->out, P_SAMPLE, &w->sub);
}

static void write_profile_body(writer_t *w) {
    cstring_id(w, ""); /* string 0 is "" */
    value_type(w, P_SAMPLE_TYPE, "alloc_objects", "count");
    value_type(w, P_SAMPLE_TYPE, "alloc_space", "bytes");
    value_type(w, P_SAMPLE_TYPE, "inuse_objects", "count");
    value_type(w, P_SAMPLE_TYPE, "inuse_space", "bytes");
    value_type(w, P_PERIOD_TYPE, "space", "bytes");
    pb_uint(&w->out, P_PERIOD, (uint64_t)coral_profile_rate());
    pb_uint(&w->out, P_DEFAULT_SAMPLE_TYPE, (uint64_t)cstring_id(w, "inuse_space"));
    pb_uint(&w->out, P_COMMENT,
            (uint64_t)cstring_id(w, "coralloc heap profile: sampled allocations, "
                                    "estimated totals (docs/PROFILING.md)"));
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    pb_uint(&w->out, P_TIME_NANOS, (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec);
    mapping_ids(w);
    for (size_t i = 0; i < w->sites.n; i++) write_sample(w, site_at(&w->sites, i));
    write_mappings(w);
    for (size_t i = 0; i < w->nstrings; i++) {
        string_ref_t *r = &((string_ref_t *)w->strings.p)[i];
        pb_bytes(&w->out, P_STRING_TABLE, r->s, r->len);
    }
}

static int write_file(const char *path, const buf_t *b) {
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return -1;
    size_t done = 0;
    while (done < b->len) {
        ssize_t n = write(fd, b->p + done, b->len - done);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) {
            int e = n < 0 ? errno : EIO;
            close(fd);
            errno = e;
            return -1;
        }
        done += (size_t)n;
    }
    return close(fd);
}

static int profile_write(const char *path, bool at_exit);

int coral_profile_write(const char *path, bool at_exit) {
    int state = coral_cancel_off(); /* (open, write: cancellation points) */
    int r = profile_write(path, at_exit);
    int err = errno;
    coral_cancel_restore(state);
    errno = err;
    return r;
}

static int profile_write(const char *path, bool at_exit) {
    arena_t arena = {0};
    writer_t *w = arena_take(&arena, sizeof(writer_t));
    if (w == NULL) return errno = ENOMEM, -1;
    w->sites.list = w->strings = w->out = w->sub = w->sub2 = buf_in(&arena);
    coral_profile_sites_visit(site_collect, &w->sites);
    /* No sample (a short process, at the default rate most): no location,
     * so no mapping to write, and no file of the process's to read. */
    if (w->sites.n != 0)
        symbolizer_init(&w->z, &arena, at_exit, site_at(&w->sites, 0), w->sites.n);
    else
        symbolizer_clear(&w->z, &arena);
    size_t frames = 0;
    for (size_t i = 0; i < w->sites.n; i++) frames += site_at(&w->sites, i)->depth;
    int rc = -1;
    errno = ENOMEM;
    if (table_init(&w->string_ids, frames + w->z.nmaps + 64, &arena) &&
        table_init(&w->loc_ids, frames + 16, &arena) &&
        table_init(&w->func_ids, frames + 16, &arena)) {
        write_profile_body(w);
        bool failed = w->out.failed || w->sub.failed || w->sub2.failed || w->strings.failed ||
                      w->sites.list.failed;
        if (!failed) rc = write_file(path, &w->out);
    }
    if (!at_exit) { /* (at exit, the process's end unmaps them: a system call each saved) */
        int saved = errno;
        symbolizer_done(&w->z);
        arena_done(&arena);
        errno = saved;
    }
    return rc;
}

/* ---- the leak report ------------------------------------------------------------------ */

#define LEAK_SITES 10 /* sites printed */
#define LEAK_FRAMES 4 /* frames printed per site */

/* "f1 < f2 < f3" for the site's first frames, into out. */
static void site_frames_text(symbolizer_t *z, const coral_profile_site_t *s, char *out,
                             size_t cap) {
    size_t n = 0;
    uint32_t first = first_program_frame(z, s), end = program_frames_end(z, s, first);
    for (uint32_t i = first; i < end && i < first + LEAK_FRAMES; i++) {
        mapping_t *m;
        size_t len = 0;
        const char *name = function_at(z, s->pcs[i] - 1, &m, &len);
        char hex[32];
        if (name == NULL) { /* no symbol: the address */
            static const char digits[] = "0123456789abcdef";
            int k = 0;
            hex[k++] = '0';
            hex[k++] = 'x';
            for (int shift = 44; shift >= 0; shift -= 4)
                hex[k++] = digits[(s->pcs[i] - 1) >> shift & 15];
            name = hex;
            len = (size_t)k;
        }
        const char *sep = i == first ? "" : " < ";
        for (const char *t = sep; *t && n + 1 < cap; t++) out[n++] = *t;
        for (size_t k = 0; k < len && n + 1 < cap; k++) out[n++] = name[k];
    }
    out[n] = '\0';
}

static void report_leaks(const coral_profile_exact_t *exact);

void coral_profile_report_leaks(const coral_profile_exact_t *exact) {
    int state = coral_cancel_off();
    report_leaks(exact);
    coral_cancel_restore(state);
}

static void report_leaks(const coral_profile_exact_t *exact) {
    arena_t arena = {0};
    symbolizer_t z;
    sites_t sites = {.list = buf_in(&arena)};
    symbolizer_init(&z, &arena, false, NULL, 0);
    coral_profile_sites_visit(site_collect, &sites);
    double bytes = 0, objects = 0;
    size_t live_sites = 0;
    for (size_t i = 0; i < sites.n; i++) {
        coral_profile_site_t *s = site_at(&sites, i);
        if (rounded(s->inuse_objects) == 0) continue;
        live_sites++;
        bytes += s->inuse_bytes;
        objects += s->inuse_objects;
    }
    coral_message("leak report (a sampled estimate, one sample per ~%lld bytes allocated): "
                  "~%lld bytes in ~%lld blocks still live at exit, from %zu sites",
                  (long long)coral_profile_rate(), (long long)rounded(bytes),
                  (long long)rounded(objects), live_sites);
    if (exact != NULL)
        coral_message("  exactly: %llu blocks, %llu usable bytes live in the exiting thread's own "
                      "heap (a walk of its pages)",
                      exact->blocks, exact->bytes);
    /* The largest sites first: LEAK_SITES rounds of picking the largest
     * not printed yet (its inuse_bytes set to -1 once printed). */
    for (int k = 0; k < LEAK_SITES; k++) {
        coral_profile_site_t *top = NULL;
        for (size_t i = 0; i < sites.n; i++) {
            coral_profile_site_t *s = site_at(&sites, i);
            if (rounded(s->inuse_objects) > 0 && (top == NULL || s->inuse_bytes > top->inuse_bytes))
                top = s;
        }
        if (top == NULL) break;
        char frames[1024];
        site_frames_text(&z, top, frames, sizeof frames);
        coral_message("  ~%lld bytes in ~%lld blocks: %s", (long long)rounded(top->inuse_bytes),
                      (long long)rounded(top->inuse_objects), frames);
        top->inuse_objects = 0;
    }
    symbolizer_done(&z);
    arena_done(&arena);
}
