/*
 * iot_gate: the Mosquitto 2.0 plugin that binds every MQTT login of an iot-stack site to its job.
 *
 * Loaded once per listener (per_listener_settings true) with `plugin_opt_role services|devices`:
 *   services  the overlay listener: accounts from a file (kind bridge|agent, bound client-id prefix);
 *             the agent keeps the device table current through $CONTROL/iot-gate/v1.
 *   devices   the device listener: device logins from the device table, each bound to its own
 *             client id, topics and publish rate; refused until a bridge has subscribed after start.
 * The contract, its tests and the reasons behind it: docs/security.md ("What a device login can do").
 */
#define _GNU_SOURCE
#include <ctype.h>
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/x509.h>
#include <uthash.h>

#include <mosquitto.h>
#include <mosquitto_broker.h>
#include <mosquitto_plugin.h>

#define CONTROL_TOPIC "$CONTROL/iot-gate/v1"
#define RESPONSE_TOPIC "$CONTROL/iot-gate/v1/response"
#define MAX_ID 64
#define MAX_DIGEST 64
#define MAX_SALT 64
#define OFFENDERS 50                 /* devices whose offences the stats name (the most recent ones) */
#define RECONNECTS_PER_MINUTE 10     /* more connections of one device in a minute are an offence */
/* Over its rate, a device's connection closes without PUBACK. Closing at the first QoS 1 reading over would
 * also lose the PUBACKs Mosquitto has just written for the readings before it (a close with unread data is a
 * TCP reset), so a device that pipelines its backlog would resend the same readings for ever
 * (docs/faults.md, "A device whose backlog outgrows its burst"). So the connection lives GRACE_S more, its
 * readings taken on credit (at most one more burst), and the login then rests: refused at CONNECT until its
 * bucket holds REST_S of its rate again. QoS 0 readings, which have no PUBACK, get no credit. */
#define GRACE_S 1.0
#define REST_S 1.0

enum role { ROLE_SERVICES, ROLE_DEVICES };

/* What a known login did that it must not; each named in the stats, per login (docs/security.md). */
enum offence { OFF_WRONG_PASSWORD, OFF_DISABLED, OFF_CLIENT_ID, OFF_CERTIFICATE, OFF_SUBSCRIBE, OFF_PUBLISH,
	OFF_RATE, OFF_DUPLICATE, OFF_RECONNECTING, OFF_SERVICE_ON_DEVICES, OFF_DEVICE_ON_SERVICES, OFF_COUNT };
static const char *OFFENCE_NAMES[OFF_COUNT] = {"wrong_password", "disabled_device_login", "client_id_not_device_id",
	"no_certificate", "subscribe_denied", "publish_denied", "rate_limited", "duplicate_login", "reconnecting",
	"service_login_on_device_listener", "device_login_on_services_listener"};
enum kind { KIND_BRIDGE, KIND_AGENT };

struct instance {
	enum role role;
	mosquitto_plugin_id_t *id;
};

struct secret {                    /* a $7$ hash: PBKDF2-HMAC-SHA512 */
	int iterations;
	unsigned char salt[MAX_SALT];
	int salt_len;
	unsigned char digest[MAX_DIGEST];
	int digest_len;
};

struct device {
	char id[MAX_ID + 1];
	bool enabled;
	bool certificate;              /* logs in with a client certificate whose CN is its id */
	bool has_secret;
	struct secret secret;
	char *line;                    /* its canonical line: persisted, and compared to tell a change */
	double tokens;                 /* publish rate: token bucket, below 0 while in debt (GRACE_S) */
	double refilled_at;
	double over_since;             /* its connection's first reading over the rate, 0 if none */
	unsigned long rate_limited;
	int connections;               /* open connections with its login (more than one: someone else has it) */
	double minute_start;           /* connections in the current minute, to tell a reconnecting loop */
	int minute_connects;
	UT_hash_handle hh;
};

struct account {
	char user[MAX_ID + 1];
	enum kind kind;
	char prefix[MAX_ID + 1];       /* its client ids start with this */
	struct secret secret;
	struct account *next;
};

/* A device connection the gate let in, until Mosquitto reports it closed: the devices connected now, which
 * Mosquitto's $SYS says only when the figure changes (and, with retain_available false, to no late subscriber). */
struct session {
	struct mosquitto *client;
	UT_hash_handle hh;
};

struct offender {
	char id[MAX_ID + 1];
	unsigned long count[OFF_COUNT];
	unsigned long seen;            /* g.offences when last seen: the least recent one makes room */
};

static struct {
	struct device *devices;
	struct device *pending;        /* a snapshot being received */
	char pending_token[65];
	int pending_next;
	struct account *accounts;
	char *devices_file;
	char publish_template[512];
	char subscribe_template[512];
	double rate;
	double burst;
	bool gate_open;
	time_t started;
	double last_gate_log;
	struct offender offenders[OFFENDERS];
	struct session *sessions;
	unsigned long auth_ok, auth_refused, unknown_device, gate_refused, acl_denied_publish, acl_denied_subscribe,
		rate_limited, rested, control, kicked, offences;
	int instances;
} g;

/* ------------------------------------------------------------------ helpers */

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static bool valid_id(const char *id)
{
	size_t n = strlen(id);
	if(n == 0 || n > MAX_ID || !isalnum((unsigned char)id[0])) return false;
	for(size_t i = 0; i < n; i++){
		unsigned char c = (unsigned char)id[i];
		if(!isalnum(c) && c != '_' && c != '.' && c != '-') return false;
	}
	return true;
}

static int b64_decode(const char *in, unsigned char *out, int max)
{
	size_t len = strlen(in);
	if(len == 0 || len % 4 || (len / 4) * 3 > (size_t)max + 2) return -1;
	unsigned char buf[MAX_DIGEST * 2];
	int n = EVP_DecodeBlock(buf, (const unsigned char *)in, (int)len);
	if(n < 0) return -1;
	if(in[len - 1] == '=') n--;
	if(in[len - 2] == '=') n--;
	if(n > max) return -1;
	memcpy(out, buf, (size_t)n);
	return n;
}

/* "$7$<iterations>$<salt b64>$<digest b64>" */
static bool parse_secret(const char *text, struct secret *s)
{
	char copy[400], *iter, *salt, *digest, *end;
	if(strncmp(text, "$7$", 3) || strlen(text) >= sizeof(copy)) return false;
	strcpy(copy, text + 3);
	iter = copy;
	salt = strchr(iter, '$');
	if(!salt) return false;
	*salt++ = '\0';
	digest = strchr(salt, '$');
	if(!digest) return false;
	*digest++ = '\0';
	errno = 0;
	long it = strtol(iter, &end, 10);
	if(errno || *end || it < 1 || it > 10000000) return false;
	s->iterations = (int)it;
	s->salt_len = b64_decode(salt, s->salt, MAX_SALT);
	s->digest_len = b64_decode(digest, s->digest, MAX_DIGEST);
	return s->salt_len > 0 && s->digest_len > 0;
}

static bool secret_matches(const struct secret *s, const char *password)
{
	unsigned char out[MAX_DIGEST];
	if(!password) return false;
	if(!PKCS5_PBKDF2_HMAC(password, (int)strlen(password), s->salt, s->salt_len, s->iterations,
				EVP_sha512(), s->digest_len, out)){
		return false;
	}
	return CRYPTO_memcmp(out, s->digest, (size_t)s->digest_len) == 0;
}

/* The template with %u replaced by the user name (names are checked: no wildcards or slashes). */
static bool expand(const char *template, const char *user, char *out, size_t size)
{
	size_t o = 0;
	for(const char *p = template; *p; p++){
		if(p[0] == '%' && p[1] == 'u'){
			size_t n = strlen(user);
			if(o + n >= size) return false;
			memcpy(out + o, user, n);
			o += n;
			p++;
		}else{
			if(o + 1 >= size) return false;
			out[o++] = *p;
		}
	}
	out[o] = '\0';
	return true;
}

static bool starts_with(const char *text, const char *prefix)
{
	return strncmp(text, prefix, strlen(prefix)) == 0;
}

/* ------------------------------------------------------------------ the device table */

static void free_device(struct device *d)
{
	free(d->line);
	free(d);
}

static void free_table(struct device **table)
{
	struct device *d, *tmp;
	HASH_ITER(hh, *table, d, tmp){
		HASH_DEL(*table, d);
		free_device(d);
	}
}

/* One line "<id> <1|0> <password|certificate> <hash|->" -> a device, or NULL (and why). */
static struct device *parse_device(const char *line, const char **why)
{
	char id[MAX_ID + 2], enabled[4], auth[16], hash[400];
	if(sscanf(line, "%65s %3s %15s %399s", id, enabled, auth, hash) != 4){
		*why = "expected: <id> <1|0> <password|certificate> <hash|->";
		return NULL;
	}
	if(!valid_id(id)){
		*why = "invalid device id (letters, digits, '_', '.', '-'; at most 64)";
		return NULL;
	}
	struct device *d = calloc(1, sizeof(*d));
	if(!d){
		*why = "out of memory";
		return NULL;
	}
	strcpy(d->id, id);
	d->enabled = strcmp(enabled, "1") == 0;
	if(!strcmp(auth, "certificate")){
		d->certificate = true;
	}else if(strcmp(auth, "password")){
		*why = "auth must be password or certificate";
		free(d);
		return NULL;
	}
	if(strcmp(hash, "-")){
		if(!parse_secret(hash, &d->secret)){
			*why = "hash must be $7$<iterations>$<salt>$<digest>";
			free(d);
			return NULL;
		}
		d->has_secret = true;
	}else if(!d->certificate){
		*why = "a password device needs a hash";
		free(d);
		return NULL;
	}
	if(asprintf(&d->line, "%s %s %s %s", id, d->enabled ? "1" : "0", auth, hash) < 0){
		d->line = NULL;
		*why = "out of memory";
		free(d);
		return NULL;
	}
	d->tokens = g.burst;
	d->refilled_at = now_s();
	return d;
}

/* What a device's entry keeps when it is replaced: its rate, its connections. */
static void carry_state(const struct device *from, struct device *to)
{
	to->tokens = from->tokens;
	to->refilled_at = from->refilled_at;
	to->rate_limited = from->rate_limited;
	to->over_since = from->over_since;
	to->connections = from->connections;
	to->minute_start = from->minute_start;
	to->minute_connects = from->minute_connects;
}

static void offend(const char *id, enum offence what)
{
	int slot = 0;
	for(int i = 0; i < OFFENDERS; i++){
		if(!strcmp(g.offenders[i].id, id)){
			slot = i;
			goto found;
		}
		if(g.offenders[i].seen < g.offenders[slot].seen) slot = i;
	}
	memset(&g.offenders[slot], 0, sizeof(g.offenders[slot]));
	strcpy(g.offenders[slot].id, id);
found:
	g.offenders[slot].count[what]++;
	g.offenders[slot].seen = ++g.offences;
}

/* Adds or replaces; returns true when a connected device must be kicked (removed, disabled, new secret). */
static bool put_device(struct device **table, struct device *d)
{
	struct device *old = NULL;
	HASH_FIND_STR(*table, d->id, old);
	bool kick = false;
	if(old){
		kick = !d->enabled || strcmp(old->line, d->line) != 0;
		carry_state(old, d);
		HASH_DEL(*table, old);
		free_device(old);
	}
	HASH_ADD_STR(*table, id, d);
	return kick;
}

static int save_devices(void)
{
	if(!g.devices_file) return MOSQ_ERR_SUCCESS;
	char tmp[4096];
	if(snprintf(tmp, sizeof(tmp), "%s.tmp", g.devices_file) >= (int)sizeof(tmp)) return MOSQ_ERR_INVAL;
	FILE *f = fopen(tmp, "w");
	if(!f){
		mosquitto_log_printf(MOSQ_LOG_ERR, "iot_gate: cannot write %s: %s", tmp, strerror(errno));
		return MOSQ_ERR_ERRNO;
	}
	fputs("# iot-gate devices v1 (kept by the plugin from the device-credentials topic; do not edit)\n", f);
	struct device *d, *t;
	HASH_ITER(hh, g.devices, d, t){
		fprintf(f, "%s\n", d->line);
	}
	bool ok = fflush(f) == 0 && fsync(fileno(f)) == 0;
	ok = fclose(f) == 0 && ok;
	if(!ok || rename(tmp, g.devices_file)){
		mosquitto_log_printf(MOSQ_LOG_ERR, "iot_gate: cannot save %s: %s", g.devices_file, strerror(errno));
		return MOSQ_ERR_ERRNO;
	}
	return MOSQ_ERR_SUCCESS;
}

static void load_devices(void)
{
	FILE *f = fopen(g.devices_file, "r");
	if(!f){
		mosquitto_log_printf(MOSQ_LOG_NOTICE, "iot_gate: no device table at %s yet: devices are refused "
				"until mosquitto-agent sends one", g.devices_file);
		return;
	}
	char line[1024];
	int n = 0, bad = 0;
	while(fgets(line, sizeof(line), f)){
		line[strcspn(line, "\r\n")] = '\0';
		if(line[0] == '#' || line[0] == '\0') continue;
		const char *why = NULL;
		struct device *d = parse_device(line, &why);
		if(d){
			put_device(&g.devices, d);
			n++;
		}else{
			bad++;
		}
	}
	fclose(f);
	mosquitto_log_printf(MOSQ_LOG_NOTICE, "iot_gate: loaded %d devices from %s (%d unreadable lines skipped)",
			n, g.devices_file, bad);
}

/* ------------------------------------------------------------------ the services' accounts */

static int load_accounts(const char *path)
{
	FILE *f = fopen(path, "r");
	if(!f){
		mosquitto_log_printf(MOSQ_LOG_ERR, "iot_gate: cannot read the services' accounts %s: %s", path, strerror(errno));
		return MOSQ_ERR_INVAL;
	}
	char line[1024];
	int lineno = 0;
	while(fgets(line, sizeof(line), f)){
		lineno++;
		line[strcspn(line, "\r\n")] = '\0';
		if(line[0] == '#' || line[0] == '\0') continue;
		char user[MAX_ID + 2], kind[16], prefix[MAX_ID + 2], hash[400];
		struct account *a = calloc(1, sizeof(*a));
		if(!a){
			fclose(f);
			return MOSQ_ERR_NOMEM;
		}
		if(sscanf(line, "%65s %15s %65s %399s", user, kind, prefix, hash) != 4 || strlen(user) > MAX_ID
				|| strlen(prefix) > MAX_ID || (strcmp(kind, "bridge") && strcmp(kind, "agent"))
				|| !parse_secret(hash, &a->secret)){
			mosquitto_log_printf(MOSQ_LOG_ERR, "iot_gate: %s line %d: expected <user> <bridge|agent> "
					"<client id prefix> <$7$ hash>", path, lineno);
			free(a);
			fclose(f);
			return MOSQ_ERR_INVAL;
		}
		strcpy(a->user, user);
		strcpy(a->prefix, prefix);
		a->kind = strcmp(kind, "bridge") ? KIND_AGENT : KIND_BRIDGE;
		a->next = g.accounts;
		g.accounts = a;
	}
	fclose(f);
	return MOSQ_ERR_SUCCESS;
}

static struct account *find_account(const char *user)
{
	if(!user) return NULL;
	for(struct account *a = g.accounts; a; a = a->next){
		if(!strcmp(a->user, user)) return a;
	}
	return NULL;
}

/* True when a device id could be mistaken for a service's client id. */
static bool reserved_id(const char *id)
{
	for(struct account *a = g.accounts; a; a = a->next){
		if(starts_with(id, a->prefix)) return true;
	}
	return starts_with(id, "bridge-") || starts_with(id, "mosquitto-agent-");
}

/* ------------------------------------------------------------------ publish rate */

static void refill(struct device *d)
{
	double t = now_s();
	d->tokens += (t - d->refilled_at) * g.rate;
	if(d->tokens > g.burst) d->tokens = g.burst;
	d->refilled_at = t;
}

/* True when the device may publish one more reading of `qos` now (see GRACE_S). */
static bool within_rate(struct device *d, int qos)
{
	if(g.rate <= 0) return true;
	refill(d);
	if(d->tokens >= 1.0){
		d->tokens -= 1.0;
		d->over_since = 0.0;                      /* back within its rate: a later burst gets its grace */
		return true;
	}
	if(d->over_since == 0.0) d->over_since = d->refilled_at;
	if(qos > 0 && d->refilled_at - d->over_since < GRACE_S && d->tokens - 1.0 >= -g.burst){
		d->tokens -= 1.0;                         /* on credit: repaid while the login rests */
		return true;
	}
	d->rate_limited++;
	g.rate_limited++;
	offend(d->id, OFF_RATE);
	if(d->rate_limited == 1 || d->rate_limited % 1000 == 0){
		mosquitto_log_printf(MOSQ_LOG_WARNING, "iot_gate: device %s publishes faster than %.0f/s (burst %.0f): "
				"disconnected without PUBACK, %lu times so far (it resends; fix the device or raise "
				"stack_mqtt_device_max_rate)", d->id, g.rate, g.burst, d->rate_limited);
	}
	return false;
}

/* True while a login that went over its rate must wait before it connects again (REST_S). */
static bool resting(struct device *d)
{
	if(g.rate <= 0) return false;
	refill(d);
	double needed = g.rate * REST_S < g.burst ? g.rate * REST_S : g.burst;
	return d->over_since != 0.0 && d->tokens < needed;
}

/* ------------------------------------------------------------------ authentication */

static bool has_certificate(struct mosquitto *client)
{
	X509 *cert = mosquitto_client_certificate(client);
	X509_free(cert);
	return cert != NULL;
}

static bool certificate_names(struct mosquitto *client, const char *id)
{
	X509 *cert = mosquitto_client_certificate(client);
	if(!cert) return false;
	char cn[MAX_ID + 2] = "";
	int n = X509_NAME_get_text_by_NID(X509_get_subject_name(cert), NID_commonName, cn, sizeof(cn));
	X509_free(cert);
	return n > 0 && (size_t)n == strlen(cn) && !strcmp(cn, id);
}

static int device_auth(struct mosquitto_evt_basic_auth *ed)
{
	const char *user = ed->username;
	if(!g.gate_open){
		/* Closing without CONNACK: the device retries later and keeps its readings meanwhile. */
		g.gate_refused++;
		double t = now_s();
		if(t - g.last_gate_log > 5.0){
			g.last_gate_log = t;
			mosquitto_log_printf(MOSQ_LOG_NOTICE, "iot_gate: refusing device logins (%s) until the bridge has "
					"subscribed: before that Mosquitto 2.0 would accept readings and route them nowhere",
					user ? user : "no user name");
		}
		return MOSQ_ERR_CONN_REFUSED;
	}
	struct device *d = NULL;
	if(user) HASH_FIND_STR(g.devices, user, d);
	const char *client_id = mosquitto_client_id(ed->client);
	enum offence what = OFF_COUNT;
	const char *why = NULL;
	if(user && find_account(user)){
		why = "a service's login on the device listener";
		what = OFF_SERVICE_ON_DEVICES;
	}else if(!user || !d || reserved_id(user)){
		why = "unknown device";
		g.unknown_device++;
	}else if(d->certificate ? !certificate_names(ed->client, user)
			: (!secret_matches(&d->secret, ed->password)
			   || (has_certificate(ed->client) && !certificate_names(ed->client, user)))){
		why = d->certificate ? "no client certificate naming the device" : "wrong password";
		what = d->certificate ? OFF_CERTIFICATE : OFF_WRONG_PASSWORD;
	}else if(!d->enabled){
		why = "device disabled";
		what = OFF_DISABLED;
	}else if(!client_id || strcmp(client_id, user)){
		/* Its own credentials under another client id: trying to take another client's session over. */
		why = "client id is not the device id";
		what = OFF_CLIENT_ID;
	}
	if(why){
		g.auth_refused++;
		if(what != OFF_COUNT) offend(user, what);
		mosquitto_log_printf(MOSQ_LOG_NOTICE, "iot_gate: device login refused (%s): %s (client id %s) from %s", why,
				user ? user : "-", client_id ? client_id : "-", mosquitto_client_address(ed->client));
		return MOSQ_ERR_AUTH;
	}
	if(resting(d)){
		/* Closing without CONNACK, as at the gate: the device keeps its readings and retries. */
		g.rested++;
		return MOSQ_ERR_CONN_REFUSED;
	}
	d->over_since = 0.0;
	g.auth_ok++;
	double t = now_s();
	if(t - d->minute_start > 60.0){
		d->minute_start = t;
		d->minute_connects = 0;
	}
	if(++d->minute_connects > RECONNECTS_PER_MINUTE) offend(d->id, OFF_RECONNECTING);
	struct session *s = calloc(1, sizeof(*s));
	if(!s){                               /* fail closed, and say why: the device only sees a refusal */
		mosquitto_log_printf(MOSQ_LOG_ERR, "iot_gate: out of memory, login of device %s refused "
				"(see MosquittoMemoryHigh: memory_limit or the host's memory)", d->id);
		return MOSQ_ERR_NOMEM;
	}
	s->client = ed->client;
	HASH_ADD_PTR(g.sessions, client, s);
	if(d->connections > 0) offend(d->id, OFF_DUPLICATE);      /* its login is in use: someone else has it */
	d->connections++;
	return MOSQ_ERR_SUCCESS;
}

static int on_disconnect(int event, void *event_data, void *userdata)
{
	(void)event;
	(void)userdata;
	struct mosquitto_evt_disconnect *ed = event_data;
	struct session *s = NULL;
	HASH_FIND_PTR(g.sessions, &ed->client, s);
	if(!s) return MOSQ_ERR_SUCCESS;       /* a login refused or closed before the gate let it in */
	HASH_DEL(g.sessions, s);
	free(s);
	const char *user = mosquitto_client_username(ed->client);
	struct device *d = NULL;
	if(user) HASH_FIND_STR(g.devices, user, d);
	if(d && d->connections > 0) d->connections--;
	return MOSQ_ERR_SUCCESS;
}

static int services_auth(struct mosquitto_evt_basic_auth *ed)
{
	struct account *a = find_account(ed->username);
	const char *client_id = mosquitto_client_id(ed->client);
	if(!a || !client_id || !starts_with(client_id, a->prefix) || !secret_matches(&a->secret, ed->password)){
		g.auth_refused++;
		struct device *d = NULL;
		if(!a && ed->username) HASH_FIND_STR(g.devices, ed->username, d);
		if(d) offend(d->id, OFF_DEVICE_ON_SERVICES);
		mosquitto_log_printf(MOSQ_LOG_NOTICE, "iot_gate: service login refused: %s (client id %s) from %s",
				ed->username ? ed->username : "-", client_id ? client_id : "-",
				mosquitto_client_address(ed->client));
		return MOSQ_ERR_AUTH;
	}
	return MOSQ_ERR_SUCCESS;
}

static int on_basic_auth(int event, void *event_data, void *userdata)
{
	(void)event;
	struct instance *inst = userdata;
	return inst->role == ROLE_DEVICES ? device_auth(event_data) : services_auth(event_data);
}

/* ------------------------------------------------------------------ access control */

static int device_acl(struct mosquitto_evt_acl_check *ed)
{
	const char *user = mosquitto_client_username(ed->client);
	struct device *d = NULL;
	if(user) HASH_FIND_STR(g.devices, user, d);
	if(!d || !d->enabled){
		return MOSQ_ERR_ACL_DENIED;
	}
	char own[512];
	bool match = false;
	switch(ed->access){
		case MOSQ_ACL_SUBSCRIBE:
			/* Exactly its own commands topic: no wildcard, no $share, no $SYS. */
			if(expand(g.subscribe_template, user, own, sizeof(own)) && !strcmp(ed->topic, own)){
				return MOSQ_ERR_SUCCESS;
			}
			g.acl_denied_subscribe++;
			offend(d->id, OFF_SUBSCRIBE);
			return MOSQ_ERR_ACL_DENIED;
		case MOSQ_ACL_UNSUBSCRIBE:
			return MOSQ_ERR_SUCCESS;
		case MOSQ_ACL_READ:
			return expand(g.subscribe_template, user, own, sizeof(own)) && !strcmp(ed->topic, own)
				? MOSQ_ERR_SUCCESS : MOSQ_ERR_ACL_DENIED;
		case MOSQ_ACL_WRITE:
			if(ed->retain || !expand(g.publish_template, user, own, sizeof(own))
					|| mosquitto_topic_matches_sub(own, ed->topic, &match) != MOSQ_ERR_SUCCESS || !match){
				g.acl_denied_publish++;
				offend(d->id, OFF_PUBLISH);
				return MOSQ_ERR_ACL_DENIED;
			}
			/* Over its rate: any error but ACL_DENIED makes Mosquitto close the connection without a
			 * PUBACK, so nothing is acknowledged and dropped (a denial would be PUBACKed to 3.1.1). */
			return within_rate(d, ed->qos) ? MOSQ_ERR_SUCCESS : MOSQ_ERR_ADMINISTRATIVE_ACTION;
		default:
			return MOSQ_ERR_ACL_DENIED;
	}
}

static int services_acl(struct mosquitto_evt_acl_check *ed)
{
	struct account *a = find_account(mosquitto_client_username(ed->client));
	if(!a) return MOSQ_ERR_ACL_DENIED;
	const char *topic = ed->topic;
	if(a->kind == KIND_AGENT){
		switch(ed->access){
			case MOSQ_ACL_SUBSCRIBE:
				return !strcmp(topic, "$SYS/#") || !strcmp(topic, RESPONSE_TOPIC) ? MOSQ_ERR_SUCCESS : MOSQ_ERR_ACL_DENIED;
			case MOSQ_ACL_UNSUBSCRIBE:
				return MOSQ_ERR_SUCCESS;
			case MOSQ_ACL_READ:
				return starts_with(topic, "$SYS/") || !strcmp(topic, RESPONSE_TOPIC) ? MOSQ_ERR_SUCCESS : MOSQ_ERR_ACL_DENIED;
			case MOSQ_ACL_WRITE:
				return !strcmp(topic, CONTROL_TOPIC) && !ed->retain ? MOSQ_ERR_SUCCESS : MOSQ_ERR_ACL_DENIED;
			default:
				return MOSQ_ERR_ACL_DENIED;
		}
	}
	/* The bridge: devices' readings and commands, never $CONTROL or $SYS. */
	if(starts_with(topic, "$CONTROL") || starts_with(topic, "$SYS")) return MOSQ_ERR_ACL_DENIED;
	if(ed->access == MOSQ_ACL_SUBSCRIBE && !g.gate_open){
		g.gate_open = true;
		mosquitto_log_printf(MOSQ_LOG_NOTICE, "iot_gate: the bridge (%s) subscribes %.0f s after start: device "
				"logins are accepted from now on", mosquitto_client_id(ed->client),
				difftime(time(NULL), g.started));
	}
	return MOSQ_ERR_SUCCESS;
}

static int on_acl_check(int event, void *event_data, void *userdata)
{
	(void)event;
	struct instance *inst = userdata;
	return inst->role == ROLE_DEVICES ? device_acl(event_data) : services_acl(event_data);
}

/* ------------------------------------------------------------------ control */

static void respond(struct mosquitto *client, bool ok, const char *command, const char *error)
{
	static char body[32768];
	size_t size = sizeof(body) - 16;
	int n = snprintf(body, size,
			"{\"ok\":%s,\"command\":\"%s\",\"error\":\"%s\",\"devices\":%u,\"connected\":%u,\"gate_open\":%s,"
			"\"uptime_s\":%.0f,"
			"\"kicked\":%lu,\"counters\":{\"auth_ok\":%lu,\"auth_refused\":%lu,\"unknown_device\":%lu,"
			"\"gate_refused\":%lu,\"acl_denied_publish\":%lu,\"acl_denied_subscribe\":%lu,\"rate_limited\":%lu,"
			"\"rested\":%lu,\"control\":%lu,\"offences\":%lu},\"offences\":{",
			ok ? "true" : "false", command, error ? error : "", HASH_COUNT(g.devices),
			HASH_COUNT(g.sessions), g.gate_open ? "true" : "false", difftime(time(NULL), g.started), g.kicked,
			g.auth_ok, g.auth_refused, g.unknown_device, g.gate_refused, g.acl_denied_publish, g.acl_denied_subscribe,
			g.rate_limited, g.rested, g.control, g.offences);
	bool first = true;
	for(int i = 0; i < OFFENDERS && n > 0 && (size_t)n < size - 400; i++){
		if(g.offenders[i].id[0] == '\0') continue;
		n += snprintf(body + n, size - (size_t)n, "%s\"%s\":{", first ? "" : ",", g.offenders[i].id);
		bool inner = true;
		for(int k = 0; k < OFF_COUNT; k++){
			if(!g.offenders[i].count[k]) continue;
			n += snprintf(body + n, size - (size_t)n, "%s\"%s\":%lu", inner ? "" : ",", OFFENCE_NAMES[k],
					g.offenders[i].count[k]);
			inner = false;
		}
		n += snprintf(body + n, size - (size_t)n, "}");
		first = false;
	}
	if(n > 0 && (size_t)n < size){
		n += snprintf(body + n, sizeof(body) - (size_t)n, "}}");
		/* Not mosquitto_broker_publish_copy: in 2.0.11 (still in 2.0.18) it copies with plain calloc and
		 * the broker frees the copy with its counting free, so each answer lowers Mosquitto's heap count
		 * until it wraps past memory_limit and every allocation fails (all connections closed at once).
		 * A payload from mosquitto_malloc is counted both ways; the broker takes it over. */
		void *payload = mosquitto_malloc((size_t)n + 1);
		if(!payload) return;
		memcpy(payload, body, (size_t)n);
		if(mosquitto_broker_publish(mosquitto_client_id(client), RESPONSE_TOPIC, n, payload, 1, false, NULL)){
			mosquitto_free(payload);
		}
	}
}

/* Disconnects every connection of login `id`. Done inside the control callback: Mosquitto 2.0.11 calls
 * MOSQ_EVT_TICK only without per_listener_settings, which the gate needs. */
static void kick_login(const char *id)
{
	mosquitto_kick_client_by_username(id, false);
	g.kicked++;
}

/* Kicks every device of `old` that `table` no longer lets in as before. */
static void kick_changed(struct device *old, struct device *table)
{
	struct device *d, *tmp, *now;
	HASH_ITER(hh, old, d, tmp){
		now = NULL;
		HASH_FIND_STR(table, d->id, now);
		if(!now || !now->enabled || strcmp(now->line, d->line)){
			kick_login(d->id);
		}
	}
}

/* Copies the rate state of devices that stay, so a snapshot does not refill every bucket. */
static void keep_rates(struct device *old, struct device *table)
{
	struct device *d, *tmp, *prev;
	HASH_ITER(hh, table, d, tmp){
		prev = NULL;
		HASH_FIND_STR(old, d->id, prev);
		if(prev) carry_state(prev, d);
	}
}

/* Parses the device lines after the first line into `table`; NULL or an error text. With `kick`, a device
 * whose entry changed so that it must log in again is kicked at once. */
static const char *parse_lines(char *body, struct device **table, bool kick)
{
	char *save = NULL;
	for(char *line = strtok_r(body, "\n", &save); line; line = strtok_r(NULL, "\n", &save)){
		if(line[0] == '\0') continue;
		const char *why = NULL;
		struct device *d = parse_device(line, &why);
		if(!d) return why;
		if(reserved_id(d->id)){
			free_device(d);
			return "device id starts like a service's client id";
		}
		char id[MAX_ID + 1];
		strcpy(id, d->id);
		if(put_device(table, d) && kick) kick_login(id);
	}
	return NULL;
}

static int on_control(int event, void *event_data, void *userdata)
{
	(void)event;
	(void)userdata;
	struct mosquitto_evt_control *ed = event_data;
	g.control++;
	char *text = malloc(ed->payloadlen + 1);
	if(!text) return MOSQ_ERR_NOMEM;
	memcpy(text, ed->payload, ed->payloadlen);
	text[ed->payloadlen] = '\0';
	char *body = strchr(text, '\n');
	if(body) *body++ = '\0';
	else body = text + strlen(text);
	char command[32] = "", token[65] = "";
	int part = 0, parts = 0;
	sscanf(text, "%31s %64s %d %d", command, token, &part, &parts);
	const char *error = NULL;
	bool changed = false;

	if(!strcmp(command, "stats")){
		/* nothing to change */
	}else if(!strcmp(command, "snapshot")){
		if(part < 1 || parts < 1 || part > parts){
			error = "snapshot needs: snapshot <token> <part> <parts>";
		}else{
			if(part == 1 || strcmp(token, g.pending_token) || part != g.pending_next){
				free_table(&g.pending);
				if(part != 1) error = "snapshot part out of order: start again with part 1";
				strcpy(g.pending_token, token);
				g.pending_next = 1;
			}
			if(!error) error = parse_lines(body, &g.pending, false);
			if(error){
				free_table(&g.pending);
				g.pending_next = 0;
			}else if(part == parts){
				struct device *old = g.devices;
				keep_rates(old, g.pending);
				g.devices = g.pending;
				g.pending = NULL;
				g.pending_next = 0;
				kick_changed(old, g.devices);
				free_table(&old);
				changed = true;
			}else{
				g.pending_next = part + 1;
			}
		}
	}else if(!strcmp(command, "upsert")){
		error = parse_lines(body, &g.devices, true);
		changed = true;
	}else if(!strcmp(command, "remove")){
		char *save = NULL;
		for(char *id = strtok_r(body, "\n", &save); id; id = strtok_r(NULL, "\n", &save)){
			struct device *d = NULL;
			HASH_FIND_STR(g.devices, id, d);
			if(d){
				HASH_DEL(g.devices, d);
				free_device(d);
				kick_login(id);
				changed = true;
			}
		}
	}else{
		error = "unknown command (snapshot, upsert, remove, stats)";
	}
	if(changed && save_devices() != MOSQ_ERR_SUCCESS && !error){
		error = "could not save the device table (see Mosquitto's log)";
	}
	if(error){
		mosquitto_log_printf(MOSQ_LOG_ERR, "iot_gate: control '%s' failed: %s", command, error);
	}
	respond(ed->client, error == NULL, command, error);
	free(text);
	return MOSQ_ERR_SUCCESS;
}

/* ------------------------------------------------------------------ plugin entry points */

static const char *option(struct mosquitto_opt *opts, int count, const char *key)
{
	for(int i = 0; i < count; i++){
		if(!strcmp(opts[i].key, key)) return opts[i].value;
	}
	return NULL;
}

int mosquitto_plugin_version(int supported_version_count, const int *supported_versions)
{
	for(int i = 0; i < supported_version_count; i++){
		if(supported_versions[i] == 5) return 5;
	}
	return -1;
}

int mosquitto_plugin_init(mosquitto_plugin_id_t *identifier, void **userdata, struct mosquitto_opt *opts, int count)
{
	const char *role = option(opts, count, "role");
	const char *devices_file = option(opts, count, "devices_file");
	if(!role || (strcmp(role, "services") && strcmp(role, "devices"))){
		mosquitto_log_printf(MOSQ_LOG_ERR, "iot_gate: plugin_opt_role must be services or devices");
		return MOSQ_ERR_INVAL;
	}
	if(!devices_file){
		mosquitto_log_printf(MOSQ_LOG_ERR, "iot_gate: plugin_opt_devices_file is required");
		return MOSQ_ERR_INVAL;
	}
	struct instance *inst = calloc(1, sizeof(*inst));
	if(!inst) return MOSQ_ERR_NOMEM;
	inst->id = identifier;
	inst->role = strcmp(role, "devices") ? ROLE_SERVICES : ROLE_DEVICES;
	*userdata = inst;

	if(g.instances++ == 0){
		g.started = time(NULL);
		g.devices_file = strdup(devices_file);
	}
	int rc = MOSQ_ERR_SUCCESS;
	if(inst->role == ROLE_SERVICES){
		const char *accounts = option(opts, count, "accounts");
		if(!accounts){
			mosquitto_log_printf(MOSQ_LOG_ERR, "iot_gate: the services listener needs plugin_opt_accounts");
			return MOSQ_ERR_INVAL;
		}
		rc = load_accounts(accounts);
		if(rc) return rc;
		rc = mosquitto_callback_register(identifier, MOSQ_EVT_CONTROL, on_control, CONTROL_TOPIC, inst);
		if(rc) return rc;
	}else{
		const char *publish = option(opts, count, "publish");
		const char *subscribe = option(opts, count, "subscribe");
		const char *rate = option(opts, count, "rate");
		const char *burst = option(opts, count, "burst");
		if(!publish || !subscribe || strlen(publish) >= sizeof(g.publish_template)
				|| strlen(subscribe) >= sizeof(g.subscribe_template)){
			mosquitto_log_printf(MOSQ_LOG_ERR, "iot_gate: the devices listener needs plugin_opt_publish and "
					"plugin_opt_subscribe (topic templates with %%u for the device id)");
			return MOSQ_ERR_INVAL;
		}
		strcpy(g.publish_template, publish);
		strcpy(g.subscribe_template, subscribe);
		g.rate = rate ? atof(rate) : 0.0;
		g.burst = burst ? atof(burst) : (g.rate > 0 ? g.rate : 1.0);
		if(g.burst < 1.0) g.burst = 1.0;
		load_devices();
		rc = mosquitto_callback_register(identifier, MOSQ_EVT_DISCONNECT, on_disconnect, NULL, inst);
		if(rc) return rc;
		mosquitto_log_printf(MOSQ_LOG_NOTICE, "iot_gate: devices publish to %s, subscribe to %s, at most %.0f "
				"readings/s each (burst %.0f); device logins wait for the bridge's subscription",
				g.publish_template, g.subscribe_template, g.rate, g.burst);
	}
	rc = mosquitto_callback_register(identifier, MOSQ_EVT_BASIC_AUTH, on_basic_auth, NULL, inst);
	if(rc) return rc;
	return mosquitto_callback_register(identifier, MOSQ_EVT_ACL_CHECK, on_acl_check, NULL, inst);
}

int mosquitto_plugin_cleanup(void *userdata, struct mosquitto_opt *opts, int count)
{
	(void)opts;
	(void)count;
	struct instance *inst = userdata;
	if(inst){
		mosquitto_callback_unregister(inst->id, MOSQ_EVT_BASIC_AUTH, on_basic_auth, NULL);
		mosquitto_callback_unregister(inst->id, MOSQ_EVT_ACL_CHECK, on_acl_check, NULL);
		if(inst->role == ROLE_SERVICES){
			mosquitto_callback_unregister(inst->id, MOSQ_EVT_CONTROL, on_control, CONTROL_TOPIC);
		}else{
			mosquitto_callback_unregister(inst->id, MOSQ_EVT_DISCONNECT, on_disconnect, NULL);
		}
		free(inst);
	}
	if(--g.instances == 0){
		free_table(&g.devices);
		free_table(&g.pending);
		while(g.accounts){
			struct account *next = g.accounts->next;
			free(g.accounts);
			g.accounts = next;
		}
		free(g.devices_file);
		g.devices_file = NULL;
		struct session *s, *tmp;
		HASH_ITER(hh, g.sessions, s, tmp){
			HASH_DEL(g.sessions, s);
			free(s);
		}
	}
	return MOSQ_ERR_SUCCESS;
}
