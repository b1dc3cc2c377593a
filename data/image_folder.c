/* image_folder.c: datasets from a folder of class sub-folders of images,
 * decoded by data/image.c (libpng, libjpeg-turbo, its own BMP reader). See
 * dataset.h.
 *
 * Two passes: the first reads each file's header (after the checks of
 * image.h) to check that every file is an image of the common size, to count
 * them and to see their channels; the second decodes straight into the
 * dataset's pixel tensor. So a bad file is reported before any pixel memory
 * is taken, and pixels are held once. The channel count is the caller's, or
 * else decided from every file (colour if any file is), never from the
 * first one alone. */
#include "dataset.h"

#include <dirent.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "image.h"

typedef struct {
    char **items;
    int n, cap;
} name_list;

static void list_free(name_list *l) {
    for (int i = 0; i < l->n; i++)
        free(l->items[i]);
    free(l->items);
    memset(l, 0, sizeof *l);
}

static fr_status list_add(name_list *l, const char *s) {
    if (l->n == l->cap) {
        int cap = l->cap ? 2 * l->cap : 64;
        char **items = realloc(l->items, (size_t)cap * sizeof *items);
        if (!items)
            return fr_error(FR_ERR_OOM, "image folder: out of memory listing files");
        l->items = items;
        l->cap = cap;
    }
    if (!(l->items[l->n] = strdup(s)))
        return fr_error(FR_ERR_OOM, "image folder: out of memory listing files");
    l->n++;
    return FR_OK;
}

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The names in `dir` (dot files skipped) that are directories (want_dirs)
 * or regular files, sorted. */
static fr_status list_dir(name_list *out, const char *dir, bool want_dirs) {
    DIR *d = opendir(dir);
    if (!d)
        return fr_error(FR_ERR_IO, "image folder: cannot open %s: %s", dir, strerror(errno));
    fr_status st = FR_OK;
    char path[4096];
    for (struct dirent *e; st == FR_OK && (e = readdir(d));) {
        if (e->d_name[0] == '.')
            continue;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        struct stat sb;
        if (stat(path, &sb) != 0)
            st = fr_error(FR_ERR_IO, "image folder: cannot stat %s: %s", path, strerror(errno));
        else if (want_dirs ? S_ISDIR(sb.st_mode) : S_ISREG(sb.st_mode))
            st = list_add(out, e->d_name);
    }
    closedir(d);
    if (st == FR_OK && out->n)
        qsort(out->items, (size_t)out->n, sizeof *out->items, cmp_str);
    return st;
}

/* The label of each of dir's classes: its index among `names` (sorted),
 * the training split's classes; an error names a class they lack. */
static fr_status map_classes(const name_list *classes, const char *dir, const name_list *names,
                             const char *names_dir, int *label_of) {
    for (int k = 0; k < classes->n; k++) {
        char **hit = bsearch(&classes->items[k], names->items, (size_t)names->n, sizeof *names->items,
                             cmp_str);
        if (!hit) {
            char list[512] = "";
            size_t used = 0;
            for (int j = 0; j < names->n && used < sizeof list; j++)
                used += (size_t)snprintf(list + used, sizeof list - used, "%s%s", j ? ", " : "",
                                         names->items[j]);
            return fr_error(FR_ERR_FORMAT, "image folder: class \"%s\" of %s is not a class of %s (its "
                            "classes: %s%s): the labels would not mean the same", classes->items[k], dir,
                            names_dir, list, used >= sizeof list ? "..." : "");
        }
        label_of[k] = (int)(hit - names->items);
    }
    return FR_OK;
}

/* Keeps `limit` of the listed files, a stratified prefix: the first file
 * of every class, then the second of every class, ... (files are listed
 * class by class), in their listed order; not the first classes whole. */
static void keep_stratified(name_list *files, int *labels, const int *first, int n_classes,
                            int64_t limit) {
    if (limit <= 0 || limit >= files->n)
        return;
    bool *keep = calloc((size_t)files->n, sizeof *keep);
    if (!keep)
        return; /* caught below: the count stays over the limit */
    int64_t kept = 0;
    for (int r = 0; kept < limit; r++)
        for (int k = 0; k < n_classes && kept < limit; k++)
            if (first[k] + r < first[k + 1]) {
                keep[first[k] + r] = true;
                kept++;
            }
    int out = 0;
    for (int i = 0; i < files->n; i++) {
        if (!keep[i]) {
            free(files->items[i]);
            continue;
        }
        files->items[out] = files->items[i];
        labels[out++] = labels[i];
    }
    files->n = out;
    free(keep);
}

fr_dataset *fr_dataset_load_folder(const char *dir, int channels) {
    return fr_dataset_load_folder_split(dir, channels, NULL, 0);
}

fr_dataset *fr_dataset_load_folder_split(const char *dir, int channels, const char *classes_dir,
                                         int64_t limit) {
    if (!dir || (channels != 0 && channels != 1 && channels != 3) || limit < 0) {
        fr_error(FR_ERR_ARG, "image folder: dir must be given, channels be 0, 1 or 3 (got %d) and limit "
                 ">= 0", channels);
        return NULL;
    }
    name_list classes = {0}, files = {0}, names = {0};
    int *labels = NULL, *label_of = NULL, *first = NULL, w0 = 0, h0 = 0;
    fr_dataset *ds = NULL;
    char path[4096];
    if (fr_dataset_check_dir("image folder", dir) != FR_OK || list_dir(&classes, dir, true) != FR_OK)
        goto done;
    if (classes.n == 0) {
        fr_error(FR_ERR_FORMAT, "image folder: %s has no class sub-folders", dir);
        goto done;
    }
    /* the labels: the classes of classes_dir (the training split) by name */
    if (classes_dir && (fr_dataset_check_dir("image folder", classes_dir) != FR_OK ||
                        list_dir(&names, classes_dir, true) != FR_OK))
        goto done;
    if (classes_dir && names.n == 0) {
        fr_error(FR_ERR_FORMAT, "image folder: %s has no class sub-folders", classes_dir);
        goto done;
    }
    label_of = calloc((size_t)classes.n, sizeof *label_of);
    first = calloc((size_t)classes.n + 1, sizeof *first);
    if (!label_of || !first) {
        fr_error(FR_ERR_OOM, "image folder: out of memory listing files");
        goto done;
    }
    for (int k = 0; k < classes.n; k++)
        label_of[k] = k;
    if (classes_dir && map_classes(&classes, dir, &names, classes_dir, label_of) != FR_OK)
        goto done;
    /* pass 1: list, and check every file's header */
    for (int k = 0; k < classes.n; k++) {
        name_list in_class = {0};
        snprintf(path, sizeof path, "%s/%s", dir, classes.items[k]);
        fr_status st = list_dir(&in_class, path, false);
        if (st == FR_OK && in_class.n == 0)
            st = fr_error(FR_ERR_FORMAT, "image folder: class folder %s holds no image files", path);
        int *grown = st == FR_OK ? realloc(labels, (size_t)(files.n + in_class.n) * sizeof *labels) : NULL;
        if (st == FR_OK && !grown)
            st = fr_error(FR_ERR_OOM, "image folder: out of memory listing files");
        if (grown)
            labels = grown;
        first[k] = files.n;
        for (int i = 0; st == FR_OK && i < in_class.n; i++) {
            snprintf(path, sizeof path, "%s/%s/%s", dir, classes.items[k], in_class.items[i]);
            labels[files.n] = label_of[k];
            st = list_add(&files, path);
        }
        list_free(&in_class);
        if (st != FR_OK)
            goto done;
    }
    first[classes.n] = files.n;
    keep_stratified(&files, labels, first, classes.n, limit);
    if (limit > 0 && files.n > limit) {
        fr_error(FR_ERR_OOM, "image folder: out of memory choosing %lld images", (long long)limit);
        goto done;
    }
    int widest = 0;
    for (int i = 0; i < files.n; i++) {
        int w, h, comp;
        uint8_t *buf;
        size_t len;
        fr_status st = fr_read_regular_file(files.items[i], FR_IMAGE_MAX_FILE, &buf, &len);
        if (st == FR_OK)
            st = fr_image_info(buf, len, files.items[i], &w, &h, &comp);
        free(buf);
        if (st != FR_OK) {
            char why[1024];
            snprintf(why, sizeof why, "%s", fr_last_error());
            fr_error(st, "image folder: %s", why);
            goto done;
        }
        widest = comp > widest ? comp : widest;
        if (i == 0) {
            w0 = w;
            h0 = h;
        } else if (w != w0 || h != h0) {
            fr_error(FR_ERR_FORMAT, "image folder: %s is %dx%d (WxH) but %s is %dx%d; all images must "
                     "have one size", files.items[i], w, h, files.items[0], w0, h0);
            goto done;
        }
    }
    if (!channels)
        channels = widest;
    const char *slash = strrchr(dir, '/');
    name_list *numbered = classes_dir ? &names : &classes;
    ds = fr_dataset_new(slash && slash[1] ? slash + 1 : dir, files.n, channels, h0, w0, numbered->n);
    if (!ds)
        goto done;
    /* pass 2: decode into (N, C, H, W), converted from the files' HWC */
    uint8_t *px = fr_data(ds->images);
    int32_t *lab = fr_data(ds->labels);
    const int64_t plane = (int64_t)h0 * w0;
    for (int i = 0; i < files.n; i++) {
        uint8_t *buf;
        size_t len;
        fr_status st = fr_read_regular_file(files.items[i], FR_IMAGE_MAX_FILE, &buf, &len);
        if (st == FR_OK)
            st = fr_image_decode(buf, len, files.items[i], channels, w0, h0,
                                 px + (int64_t)i * channels * plane);
        free(buf);
        if (st != FR_OK) {
            char why[1024];
            snprintf(why, sizeof why, "%s", fr_last_error());
            fr_error(st, "image folder: %s", why);
            fr_dataset_free(ds);
            ds = NULL;
            goto done;
        }
        lab[i] = labels[i];
    }
    ds->class_names = calloc((size_t)numbered->n, sizeof *ds->class_names);
    if (!ds->class_names) {
        fr_error(FR_ERR_OOM, "image folder: out of memory");
        fr_dataset_free(ds);
        ds = NULL;
        goto done;
    }
    /* hand the class names over */
    for (int k = 0; k < numbered->n; k++) {
        ds->class_names[k] = numbered->items[k];
        numbered->items[k] = NULL;
    }
done:
    list_free(&classes);
    list_free(&names);
    list_free(&files);
    free(labels);
    free(label_of);
    free(first);
    return ds;
}
