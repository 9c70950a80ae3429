/* fleetgate: the gateway daemon's entry point — arguments, configuration, the loop. */
#include <getopt.h>
#include <signal.h>
#include <sys/resource.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <curl/curl.h>
#include <uv.h>

#include <openssl/crypto.h>

#include "caps.h"
#include "auth.h"
#include "config.h"
#include "err.h"
#include "gw.h"
#include "log.h"
#include "noinit.h"
#include "sd.h"

PR_SKIP_GNUTLS_INIT

/* Read one key from stdin (every trailing CR and LF dropped, so `echo KEY |` and a key
 * file ending in a newline give the same line) and print the config line. The key is
 * never echoed. */
static int hash_key(void) {
  char buf[4096];
  size_t n = fread(buf, 1, sizeof(buf) - 1, stdin);
  while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == '\r')) n--;
  if (n == 0 || n >= sizeof(buf) - 1) {
    fprintf(stderr, "fleetgate --hash-key: give one key (1-4094 bytes) on stdin\n");
    return 1;
  }
  char hex[65];
  gw_auth_hash_hex(buf, n, hex);
  OPENSSL_cleanse(buf, sizeof(buf));
  printf("\"key_sha256\": \"%s\"\n", hex);
  return 0;
}

/* What --check-config --no-files left out, so the operator knows what the start will read. */
static void print_unchecked(const gw_config *c) {
  for (size_t i = 0; i < c->n_listen; i++)
    if (c->listen[i].tls_cert)
      printf("not checked (--no-files): %s's certificate %s and key %s\n", c->listen[i].address,
             c->listen[i].tls_cert, c->listen[i].tls_key);
  if (c->data_dir) printf("not checked (--no-files): data_dir %s\n", c->data_dir);
}

/* The reference of every configuration key (docs/configuration.md holds the same). */
static int print_settings(void) {
  pr_buf b;
  pr_buf_init(&b, 1 << 20);
  int rc = gw_config_settings_markdown(&b);
  if (rc == 0) fputs(pr_buf_cstr(&b), stdout);
  else fprintf(stderr, "fleetgate --print-settings: %s\n", pr_strerror(rc));
  pr_buf_free(&b);
  return rc ? 1 : 0;
}

static void usage(FILE *fp) {
  fprintf(fp,
          "usage: fleetgate --config FILE        serve\n"
          "       fleetgate --check-config FILE  validate FILE and exit (0 valid, 1 not)\n"
          "         --no-files                   ...without reading its certificates or looking for\n"
          "                                      data_dir (before they exist: a first install)\n"
          "       fleetgate --hash-key < KEYFILE  print the api_keys line for a key read on stdin\n"
          "       fleetgate --print-settings     print every configuration key as markdown tables\n"
          "       fleetgate --version\n"
          "options: --log-level debug|info|warn|error (overrides the config)\n");
}

int main(int argc, char **argv) {
  static const struct option opts[] = {
      {"config", required_argument, NULL, 'c'}, {"check-config", required_argument, NULL, 'C'},
      {"log-level", required_argument, NULL, 'l'}, {"version", no_argument, NULL, 'V'},
      {"help", no_argument, NULL, 'h'}, {"hash-key", no_argument, NULL, 'K'},
      {"print-settings", no_argument, NULL, 'S'}, {"no-files", no_argument, NULL, 'F'},
      {NULL, 0, NULL, 0}};
  const char *config = NULL, *check = NULL, *level = NULL;
  int ch, hash = 0, no_files = 0;
  while ((ch = getopt_long(argc, argv, "c:C:l:Vh", opts, NULL)) != -1) {
    switch (ch) {
      case 'c': config = optarg; break;
      case 'C': check = optarg; break;
      case 'l': level = optarg; break;
      case 'V': printf("fleetgate %s\n", FLEETGATE_VERSION); return 0;
      case 'h': usage(stdout); return 0;
      case 'K': hash = 1; break;
      case 'F': no_files = 1; break;
      case 'S': return print_settings();
      default: usage(stderr); return 2;
    }
  }
  if (hash) {
    /* a key on the command line would sit in the shell's history and in ps */
    if (optind < argc || config || check) {
      fprintf(stderr, "fleetgate --hash-key takes no argument: it reads the key on stdin "
                      "(echo -n \"$KEY\" | fleetgate --hash-key)\n");
      return 2;
    }
    return hash_key();
  }
  if ((!config && !check) || optind < argc) {
    usage(stderr);
    return 2;
  }
  if (no_files && !check) {
    fprintf(stderr, "fleetgate: --no-files goes with --check-config (a gateway that serves needs its files)\n");
    return 2;
  }
  /* every client stream and every phone connection is a descriptor: take all the
   * kernel allows (nginx's worker_rlimit_nofile) */
  struct rlimit nofile;
  if (getrlimit(RLIMIT_NOFILE, &nofile) == 0 && nofile.rlim_cur < nofile.rlim_max) {
    nofile.rlim_cur = nofile.rlim_max;
    setrlimit(RLIMIT_NOFILE, &nofile);
  }
  /* a client that resets its connection must not kill the process (write -> EPIPE) */
  signal(SIGPIPE, SIG_IGN);
  curl_global_init(CURL_GLOBAL_DEFAULT);
  pr_log_set_app("fleetgate");
  pr_log_set_buffered(1); /* flushed once per loop turn (server.c) and at exit */
  /* secrets systemd passes with LoadCredential= become the variables the config's
   * *_env keys name (docs/deploy.md) */
  size_t n_creds = 0;
  char cred_names[512];
  int crc = pr_sd_import_credentials(&n_creds, cred_names, sizeof(cred_names));
  if (crc) fprintf(stderr, "fleetgate: cannot read $CREDENTIALS_DIRECTORY: %s\n", pr_strerror(crc));
  pr_buf errors;
  pr_buf_init(&errors, PR_CAP_REPORT);
  gw_config *conf = NULL;
  int rc = gw_config_load_opts(check ? check : config, no_files ? GW_CONFIG_NO_FILES : 0, &conf, &errors);
  if (rc) {
    fputs(pr_buf_cstr(&errors), stderr);
    pr_buf_free(&errors);
    curl_global_cleanup();
    return 1;
  }
  pr_buf_free(&errors);
  if (check) {
    printf("%s: ok (%zu replica%s)\n", check, conf->n_replicas, conf->n_replicas == 1 ? "" : "s");
    if (no_files) print_unchecked(conf);
    gw_config_unref(conf);
    curl_global_cleanup();
    return 0;
  }
  int lvl = pr_log_level_from_name(level ? level : conf->log_level);
  if (lvl < 0) {
    fprintf(stderr, "unknown log level \"%s\"\n", level);
    gw_config_unref(conf);
    return 2;
  }
  pr_log_set_level(lvl);
  if (n_creds) pr_info("credentials: %s from $CREDENTIALS_DIRECTORY", cred_names);

  uv_loop_t loop;
  uv_loop_init(&loop);
  gw_server gw;
  rc = gw_server_init(&gw, &loop, conf);
  if (rc) {
    pr_error("cannot start: %s", uv_strerror(rc));
    gw_server_shutdown(&gw);
    gw.jobs_alive = 0;
  } else {
    /* every listener is open: Type=notify's readiness */
    int nrc = pr_sd_notify("READY=1\nSTATUS=serving");
    if (nrc < 0) pr_warn("cannot tell systemd the gateway is ready ($NOTIFY_SOCKET): %s", pr_strerror(nrc));
  }
  gw_server_run(&gw);
  int closed = uv_loop_close(&loop);
  if (closed) pr_error("event loop closed with handles still open: %s", uv_strerror(closed));
  gw_server_free(&gw);
  gw_config_unref(conf);
  curl_global_cleanup();
  if (rc) return 1;
  pr_info("stopped");
  pr_log_flush();
  return closed ? 1 : 0;
}
