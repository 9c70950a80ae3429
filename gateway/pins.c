/* Phone key pins, in memory and optionally in SQLite; see pins.h. */
#include "pins.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/crypto.h>
#include <openssl/rand.h>
#include <sqlite3.h>

#include "err.h"
#include "idmap.h"
#include "log.h"
#include "privfile.h"

#define PINS_SEEN_WRITE_MS (3600 * 1000) /* last-seen times reach the file at most hourly */

/* Owns every pin and their URLs, and the database handle. */
struct gw_pins {
  gw_pin **v;    /* each pin (allocated alone: a pin found stays put); v[i]->at == i */
  size_t n, cap;
  pr_idmap by_id; /* the same by id */
  size_t n_state[2]; /* pins per gw_pin_state */
  sqlite3 *db;  /* NULL: memory only */
  char *path;
};

static const char PINS_SCHEMA[] =
    "PRAGMA journal_mode=WAL;"
    "PRAGMA synchronous=NORMAL;"
    "CREATE TABLE IF NOT EXISTS pins ("
    "  id TEXT PRIMARY KEY NOT NULL,"
    "  key TEXT NOT NULL,"
    "  url TEXT NOT NULL,"
    "  state TEXT NOT NULL CHECK (state IN ('pinned', 'pending')),"
    "  enrolled_ms INTEGER NOT NULL,"
    "  seen_ms INTEGER NOT NULL);"
    "CREATE TABLE IF NOT EXISTS meta (k TEXT PRIMARY KEY NOT NULL, v TEXT NOT NULL);";

static int pins_add_mem(gw_pins *p, const char *id, const char *key, const char *url,
                        gw_pin_state st, int64_t enrolled, int64_t seen) {
  if (strlen(id) >= sizeof(p->v[0]->id) || strlen(key) != PR_IDKEY_PUB_LEN) return PR_EPARSE;
  if (p->n == p->cap) {
    size_t cap = p->cap ? p->cap * 2 : 16;
    gw_pin **nv = realloc(p->v, cap * sizeof(*nv));
    if (!nv) return -ENOMEM;
    p->v = nv;
    p->cap = cap;
  }
  gw_pin *pin = calloc(1, sizeof(*pin));
  if (!pin || !(pin->url = strdup(url ? url : ""))) {
    free(pin);
    return -ENOMEM;
  }
  snprintf(pin->id, sizeof(pin->id), "%s", id);
  snprintf(pin->key, sizeof(pin->key), "%s", key);
  pin->state = st;
  pin->enrolled_ms = enrolled;
  pin->seen_ms = pin->saved_seen_ms = seen;
  if (pr_idmap_put_str(&p->by_id, pin->id, pin) < 0) {
    free(pin->url);
    free(pin);
    return -ENOMEM;
  }
  pin->at = p->n;
  p->v[p->n++] = pin;
  p->n_state[st == GW_PIN_PENDING]++;
  return 0;
}

/* Forget pin in memory: the last pin takes its place in the order. */
static void pins_drop_mem(gw_pins *p, gw_pin *pin) {
  pr_idmap_del_str(&p->by_id, pin->id);
  p->n_state[pin->state == GW_PIN_PENDING]--;
  gw_pin *last = p->v[--p->n];
  p->v[pin->at] = last;
  last->at = pin->at;
  free(pin->url);
  free(pin);
}

/* One statement with text and integer parameters ("t" / "i" per character of types). */
static int pins_exec(gw_pins *p, const char *sql, const char *types, ...) {
  if (!p->db) return 0;
  sqlite3_stmt *st = NULL;
  if (sqlite3_prepare_v2(p->db, sql, -1, &st, NULL) != SQLITE_OK) return -EIO;
  va_list ap;
  va_start(ap, types);
  for (int i = 0; types[i]; i++) {
    if (types[i] == 't') sqlite3_bind_text(st, i + 1, va_arg(ap, const char *), -1, SQLITE_TRANSIENT);
    else sqlite3_bind_int64(st, i + 1, va_arg(ap, int64_t));
  }
  va_end(ap);
  int rc = sqlite3_step(st);
  sqlite3_finalize(st);
  return rc == SQLITE_DONE ? 0 : -EIO;
}

int gw_pins_open(gw_pins **out, const char *path, char *err, size_t errn) {
  *out = NULL;
  gw_pins *p = calloc(1, sizeof(*p));
  if (!p) return -ENOMEM;
  if (!path) {
    *out = p;
    return 0;
  }
  if (!(p->path = strdup(path))) {
    free(p);
    return -ENOMEM;
  }
  /* it holds the secret every phone's token derives from: 0600 whatever the umask (SQLite
   * makes a new database 0644, and its -wal and -shm files as open as the database) */
  char note[512];
  int kept = pr_privfile_keep_sqlite(path, note, sizeof(note));
  if (kept > 0) pr_warn("pins file: %s could be read by others: now 0600", note);
  else if (kept < 0 && kept != -ENOENT) /* a missing folder: SQLite's open says so */
    pr_warn("pins file: cannot make %s private (0600): %s", note, pr_strerror(kept));
  char *msg = NULL;
  if (sqlite3_open_v2(path, &p->db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX,
                      NULL) != SQLITE_OK ||
      sqlite3_exec(p->db, PINS_SCHEMA, NULL, NULL, &msg) != SQLITE_OK) {
    snprintf(err, errn, "pins file %s: %s", path, msg ? msg : p->db ? sqlite3_errmsg(p->db) : "cannot open");
    sqlite3_free(msg);
    gw_pins_close(p);
    return -EIO;
  }
  sqlite3_busy_timeout(p->db, 200);
  sqlite3_stmt *st = NULL;
  int rc = 0;
  if (sqlite3_prepare_v2(p->db, "SELECT id, key, url, state, enrolled_ms, seen_ms FROM pins", -1, &st,
                         NULL) != SQLITE_OK)
    rc = -EIO;
  while (!rc && sqlite3_step(st) == SQLITE_ROW) {
    const char *id = (const char *)sqlite3_column_text(st, 0);
    const char *key = (const char *)sqlite3_column_text(st, 1);
    const char *url = (const char *)sqlite3_column_text(st, 2);
    const char *state = (const char *)sqlite3_column_text(st, 3);
    if (!id || !key || !state || !pr_idkey_valid_public(key)) continue; /* not ours: skip */
    rc = pins_add_mem(p, id, key, url, strcmp(state, "pending") == 0 ? GW_PIN_PENDING : GW_PIN_PINNED,
                      sqlite3_column_int64(st, 4), sqlite3_column_int64(st, 5));
    if (rc == PR_EPARSE) rc = 0;
  }
  sqlite3_finalize(st);
  if (rc) {
    snprintf(err, errn, "pins file %s: %s", path, sqlite3_errmsg(p->db));
    gw_pins_close(p);
    return rc;
  }
  *out = p;
  return 0;
}

void gw_pins_close(gw_pins *p) {
  if (!p) return;
  /* last-seen times not written yet: now */
  for (size_t i = 0; i < p->n; i++)
    if (p->db && p->v[i]->seen_ms != p->v[i]->saved_seen_ms)
      pins_exec(p, "UPDATE pins SET seen_ms = ?1 WHERE id = ?2", "it", p->v[i]->seen_ms, p->v[i]->id);
  pr_idmap_clear(&p->by_id);
  for (size_t i = 0; i < p->n; i++) {
    free(p->v[i]->url);
    free(p->v[i]);
  }
  free(p->v);
  if (p->db) sqlite3_close(p->db);
  free(p->path);
  free(p);
}

const char *gw_pins_path(const gw_pins *p) { return p->path; }

gw_pin *gw_pins_find(gw_pins *p, const char *id) { return pr_idmap_get_str(&p->by_id, id); }

size_t gw_pins_count(const gw_pins *p, gw_pin_state state) {
  return p->n_state[state == GW_PIN_PENDING];
}

size_t gw_pins_total(const gw_pins *p) { return p->n; }
gw_pin *gw_pins_at(gw_pins *p, size_t i) { return i < p->n ? p->v[i] : NULL; }

static const char *state_name(gw_pin_state s) { return s == GW_PIN_PENDING ? "pending" : "pinned"; }

int gw_pins_put(gw_pins *p, const char *id, const char *key, const char *url, gw_pin_state state,
                int64_t now_ms, size_t max) {
  gw_pin *old = gw_pins_find(p, id);
  if (!old && p->n >= max) return PR_ETOOLARGE;
  if (pins_exec(p,
                "INSERT OR REPLACE INTO pins (id, key, url, state, enrolled_ms, seen_ms) "
                "VALUES (?1, ?2, ?3, ?4, ?5, ?5)",
                "ttttii", id, key, url ? url : "", state_name(state), now_ms, now_ms) < 0)
    return -EIO;
  if (old) pins_drop_mem(p, old);
  return pins_add_mem(p, id, key, url, state, now_ms, now_ms);
}

int gw_pins_approve(gw_pins *p, const char *id) {
  gw_pin *pin = gw_pins_find(p, id);
  if (!pin) return -ENOENT;
  if (pin->state == GW_PIN_PINNED) return 0;
  if (pins_exec(p, "UPDATE pins SET state = 'pinned' WHERE id = ?1", "t", id) < 0) return -EIO;
  p->n_state[1]--;
  p->n_state[0]++;
  pin->state = GW_PIN_PINNED;
  return 0;
}

int gw_pins_remove(gw_pins *p, const char *id) {
  gw_pin *pin = gw_pins_find(p, id);
  if (!pin) return -ENOENT;
  if (pins_exec(p, "DELETE FROM pins WHERE id = ?1", "t", id) < 0) return -EIO;
  pins_drop_mem(p, pin);
  return 0;
}

int gw_pins_seen(gw_pins *p, gw_pin *pin, const char *url, int64_t now_ms) {
  pin->seen_ms = now_ms;
  if (url && strcmp(url, pin->url) != 0) {
    char *u = strdup(url);
    if (!u) return -ENOMEM;
    if (pins_exec(p, "UPDATE pins SET url = ?1, seen_ms = ?2 WHERE id = ?3", "tit", url, now_ms, pin->id) < 0) {
      free(u);
      return -EIO;
    }
    free(pin->url);
    pin->url = u;
    pin->saved_seen_ms = now_ms;
    return 0;
  }
  if (now_ms - pin->saved_seen_ms >= PINS_SEEN_WRITE_MS &&
      pins_exec(p, "UPDATE pins SET seen_ms = ?1 WHERE id = ?2", "it", now_ms, pin->id) == 0)
    pin->saved_seen_ms = now_ms;
  return 0;
}

int gw_pins_secret(gw_pins *p, char out[65]) {
  if (!p->db) return -ENOENT;
  sqlite3_stmt *st = NULL;
  int found = 0;
  if (sqlite3_prepare_v2(p->db, "SELECT v FROM meta WHERE k = 'token_secret'", -1, &st, NULL) != SQLITE_OK)
    return -EIO;
  if (sqlite3_step(st) == SQLITE_ROW) {
    const char *v = (const char *)sqlite3_column_text(st, 0);
    if (v && strlen(v) == 64) {
      memcpy(out, v, 65);
      found = 1;
    }
  }
  sqlite3_finalize(st);
  if (found) return 0;
  unsigned char rnd[32];
  if (RAND_bytes(rnd, sizeof(rnd)) != 1) return PR_ETLS;
  for (size_t i = 0; i < sizeof(rnd); i++) snprintf(out + 2 * i, 3, "%02x", rnd[i]);
  OPENSSL_cleanse(rnd, sizeof(rnd));
  return pins_exec(p, "INSERT OR REPLACE INTO meta (k, v) VALUES ('token_secret', ?1)", "t", out);
}

size_t gw_pins_expire(gw_pins *p, int64_t now_ms, int64_t ttl_ms, int64_t pending_ttl_ms,
                      int (*keep)(void *ud, const char *id), void *ud) {
  size_t gone = 0;
  for (size_t i = 0; i < p->n;) {
    gw_pin *pin = p->v[i];
    int64_t ttl = pin->state == GW_PIN_PENDING && pending_ttl_ms < ttl_ms ? pending_ttl_ms : ttl_ms;
    if (now_ms - pin->seen_ms > ttl && !(keep && keep(ud, pin->id)) && gw_pins_remove(p, pin->id) == 0) {
      gone++;
      continue; /* the last pin moved into place i */
    }
    i++;
  }
  return gone;
}
