/*
 * airlock_guard: the part of Airlock's boundary that lives inside each sandbox's
 * PostgreSQL server, loaded with shared_preload_libraries.
 *
 * PostgreSQL lets any role change its own password and session defaults
 * (ALTER ROLE ... PASSWORD / SET), and lets a database's owner change the
 * database (ALTER DATABASE ... SET / CONNECTION LIMIT / ALLOW_CONNECTIONS /
 * RENAME / OWNER). In a sandbox each of those is a persistent write that
 * outlives the session: a password the harness does not know, a limit lifted
 * for every later session, a setting that steers the daemon's own sessions, a
 * database nobody can connect to. No privilege can be revoked to stop them, so
 * this hook refuses them to every role that is not a superuser. Superusers (the
 * daemon's admin role, peer-authenticated) are unaffected.
 *
 * An owner-mode agent may create databases of its own (test runners do) and
 * drop them, and nothing more: a CREATE DATABASE runs as the session's own role
 * and without the options that would make a database another role's, a
 * template, unreachable or placed elsewhere (OWNER, IS_TEMPLATE,
 * ALLOW_CONNECTIONS, CONNECTION LIMIT, TABLESPACE, OID); a DROP DATABASE drops
 * only a database the session's role owns itself, so the sandbox's own
 * database (its owner role's, whose member the agent is) stays. A fork does
 * not copy its golden's template1 (three hundred files every fork would clone
 * and few use): the first CREATE DATABASE that needs it copies it into place
 * from airlock.template_source, the golden's, which the daemon gives the
 * server read-only.
 *
 * It refuses ALTER EXTENSION ... ADD and DROP too: an extension's members are
 * left out of every report (they are the extension's, not the application's),
 * so an object an agent made and then added to an extension it owns would
 * vanish from describe_schema, changes_since_fork and the planted-object check.
 * Extension scripts, trusted ones included, run as a superuser and still may.
 *
 * It also makes read-only mode hold. A session whose login role is a member of
 * airlock_readonly has every transaction made read-only before each statement,
 * utility command and function call runs (and again after each utility
 * command, since BEGIN READ WRITE or SET would turn it back), so PostgreSQL's
 * own read-only checks refuse every persistent write: tables, sequences, DDL,
 * and writes inside SECURITY DEFINER functions alike. PostgreSQL lets large
 * objects be written in a read-only transaction, so for such sessions the
 * functions that write them are refused here, however they are called (SQL,
 * PL/pgSQL, the fast-path protocol). A role setting
 * (default_transaction_read_only) could be overridden by the session; this
 * cannot.
 *
 * And it holds the sandbox's statement limit, airlock.statement_limit (set by
 * the daemon as the agent role's default; only a superuser may change it).
 * statement_timeout is the session's own: SET, a startup option or a
 * function's SET clause may turn it off. So before each statement, utility
 * command and function call (fast-path calls included) the guard makes sure a
 * statement timeout that fires within the limit is armed, arming PostgreSQL's
 * own at the limit if not, and a statement it ends is told why: "the sandbox's
 * statement limit of 30 s was reached", with how to get a longer one. It is
 * checked again when a plan is made and when a portal runs: the extended
 * protocol's Execute disarms the timeout a session turned off, after Bind
 * armed it. The daemon's watchdog stays behind it, for work no timeout
 * reaches.
 *
 * It lets a session tell how its client reached Airlock. The router ends TLS,
 * so from SQL every session looks like a local plaintext one; the router says
 * what the client's connection was in airlock.connection ("via=router
 * client=... tls=TLSv1.3 cipher=... channel_binding=..."). Only the router can:
 * each backend makes a random handshake at its start, reported to its client
 * alone (the router, which never passes it on) and readable by no SQL, and a
 * value of airlock.connection is taken only once, and only with it. Anything
 * else may only blank it.
 *
 * When the daemon ends the agent's sessions (a reset, a suspend) it first has
 * the server write why, as "airlock_ending.PID" in the data directory, for
 * each backend it ends; a backend ended by an administrator's command reads
 * its file and says so instead of "terminating connection due to
 * administrator command". Only reasons this file knows are ever shown.
 *
 * And it makes each of the server's processes end as soon as PostgreSQL's own
 * clean-up is done (end_after_cleanup): the libraries' exit handlers only
 * free memory the process is about to give back.
 */
#include "postgres.h"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "access/htup_details.h"
#include "access/parallel.h"
#include "access/xact.h"
#include "catalog/pg_authid.h"
#include "catalog/pg_database.h"
#include "commands/dbcommands.h"
#include "commands/defrem.h"
#include "common/file_perm.h"
#include "storage/fd.h"
#include "storage/ipc.h"
#include "catalog/objectaccess.h"
#include "executor/executor.h"
#include "fmgr.h"
#include "miscadmin.h"
#include "nodes/parsenodes.h"
#include "optimizer/planner.h"
#include "port/pg_bswap.h"
#include "storage/proc.h"
#include "tcop/utility.h"
#include "utils/acl.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/guc.h"
#include "utils/guc_tables.h"
#include "utils/syscache.h"
#include "utils/timeout.h"
#include "utils/timestamp.h"

#if PG_VERSION_NUM < 130000
#error "airlock_guard needs PostgreSQL 13 or newer"
#endif

#if PG_VERSION_NUM < 140000
/* Before 14, fmgroids.h named built-in functions after their C symbols. */
#define F_LO_CREAT F_BE_LO_CREAT
#define F_LO_CREATE F_BE_LO_CREATE
#define F_LO_FROM_BYTEA F_BE_LO_FROM_BYTEA
#define F_LO_IMPORT_TEXT F_BE_LO_IMPORT
#define F_LO_IMPORT_TEXT_OID F_BE_LO_IMPORT_WITH_OID
#define F_LO_PUT F_BE_LO_PUT
#define F_LOWRITE F_BE_LOWRITE
#define F_LO_TRUNCATE F_BE_LO_TRUNCATE
#define F_LO_TRUNCATE64 F_BE_LO_TRUNCATE64
#define F_LO_UNLINK F_BE_LO_UNLINK
/* ProcessUtility gained its readOnlyTree argument in 14. */
#define UTILITY_READ_ONLY_TREE_PARAM
#define UTILITY_READ_ONLY_TREE_ARG
#else
#define UTILITY_READ_ONLY_TREE_PARAM bool readOnlyTree,
#define UTILITY_READ_ONLY_TREE_ARG readOnlyTree,
#endif

#if PG_VERSION_NUM < 150000
/* template1's OID had another name before 15. */
#define Template1DbOid TemplateDbOid
#endif

/*
 * The connection headers include GSSAPI's and OpenSSL's on servers built with
 * them (Debian's are), which a host need not have. Leaving both out changes
 * nothing the guard reads: a Port's socket and startup options come before
 * their fields, and a server built without GSSAPI keeps a pointer in its place.
 */
#undef ENABLE_GSS
#undef USE_OPENSSL
#include "libpq/auth.h"
#include "libpq/libpq.h"
#include "libpq/pqformat.h"

PG_MODULE_MAGIC;

void _PG_init(void);

/* Membership in this role makes a session read-only for good. */
#define READ_ONLY_ROLE "airlock_readonly"

static ProcessUtility_hook_type previous_utility_hook = NULL;
static ExecutorStart_hook_type previous_executor_start_hook = NULL;
static ExecutorRun_hook_type previous_executor_run_hook = NULL;
static planner_hook_type previous_planner_hook = NULL;
static object_access_hook_type previous_object_access_hook = NULL;
static emit_log_hook_type previous_emit_log_hook = NULL;
static ClientAuthentication_hook_type previous_client_auth_hook = NULL;

/* This backend's handshake, until airlock.connection takes it (then empty). */
static char handshake[33] = "";
/* airlock.handshake, the reported copy of it, and airlock.connection. */
static char *handshake_setting = NULL;
static char *connection_setting = NULL;

/* airlock.template_source: where the golden's template1 files are, read-only. */
static char *template_source = NULL;

/* airlock.statement_limit, in milliseconds: 0 (off) but for the agent role. */
static int	statement_limit_ms = 0;

/* When the guard last armed the statement timeout itself (0: never). */
static TimestampTz limit_armed_at = 0;

/* The text PostgreSQL's statement timeout ends a statement with. */
#define STATEMENT_TIMEOUT_MESSAGE "canceling statement due to statement timeout"

/*
 * Makes sure the statement running now ends within the sandbox's limit: the
 * statement timeout armed (by the session's own setting, or earlier by the
 * guard) must fire within the limit from now; if none does, it is armed at the
 * limit. PostgreSQL disarms it when the statement ends, and the next one arms
 * it again.
 */
static void
hold_statement_limit(void)
{
	TimestampTz within;

	if (statement_limit_ms <= 0)
		return;
	if (get_timeout_active(STATEMENT_TIMEOUT))
	{
		if (limit_armed_at != 0 && get_timeout_start_time(STATEMENT_TIMEOUT) == limit_armed_at)
			return;
		within = TimestampTzPlusMilliseconds(GetCurrentTimestamp(), statement_limit_ms);
		if (get_timeout_finish_time(STATEMENT_TIMEOUT) <= within)
			return;
	}
	enable_timeout_after(STATEMENT_TIMEOUT, statement_limit_ms);
	limit_armed_at = get_timeout_start_time(STATEMENT_TIMEOUT);
}

/*
 * Whether the statement timeout that fired was the sandbox's limit: armed for
 * the limit or longer (by the guard, or by the session's own setting when it
 * equals the limit). A session's own shorter timeout keeps its message.
 */
static bool
fired_at_the_limit(void)
{
	TimestampTz start = get_timeout_start_time(STATEMENT_TIMEOUT);
	TimestampTz finish = get_timeout_finish_time(STATEMENT_TIMEOUT);

	return start != 0 && finish - start >= (TimestampTz) statement_limit_ms * 1000;
}

/* The prefix of the files that say why the daemon ended a backend. */
#define ENDING_PREFIX "airlock_ending."

/* Why the daemon ended a session, as its message and hint. */
typedef struct Ending
{
	const char *reason;
	const char *message;
	const char *hint;
} Ending;

static const Ending endings[] = {
	{"reset",
		"terminating connection: the sandbox is being reset to its golden's data",
		"Connect again with the same DSN: the sandbox is back, at the same address, once the reset is done."},
	{"suspend",
		"terminating connection: the sandbox is being suspended",
		"Connect again with the same DSN: connecting wakes it."},
};

/*
 * The reason the daemon left for this backend, if any (the file is removed
 * once read).
 */
static const Ending *
ending_of_this_backend(void)
{
	char		path[64];
	char		reason[32];
	size_t		n;
	FILE	   *file;

	snprintf(path, sizeof(path), ENDING_PREFIX "%d", MyProcPid);
	file = fopen(path, "r");
	if (file == NULL)
		return NULL;
	n = fread(reason, 1, sizeof(reason) - 1, file);
	fclose(file);
	unlink(path);
	reason[n] = '\0';
	while (n > 0 && (reason[n - 1] == '\n' || reason[n - 1] == '\r'))
		reason[--n] = '\0';
	for (int i = 0; i < lengthof(endings); i++)
		if (strcmp(reason, endings[i].reason) == 0)
			return &endings[i];
	return NULL;
}

/* Removes reasons left from before this server started (at postmaster start). */
static void
forget_old_endings(void)
{
	DIR		   *dir = opendir(".");
	struct dirent *entry;

	if (dir == NULL)
		return;
	while ((entry = readdir(dir)) != NULL)
		if (strncmp(entry->d_name, ENDING_PREFIX, strlen(ENDING_PREFIX)) == 0)
			unlink(entry->d_name);
	closedir(dir);
}

/* A statement ended by the sandbox's limit says so, and how to get a longer one. */
static void
airlock_guard_emit_log(ErrorData *edata)
{
	if (statement_limit_ms > 0 && edata->elevel == ERROR &&
		edata->sqlerrcode == ERRCODE_QUERY_CANCELED &&
		edata->message_id != NULL && strcmp(edata->message_id, STATEMENT_TIMEOUT_MESSAGE) == 0 &&
		fired_at_the_limit())
	{
		char	   *limit = statement_limit_ms % 1000 == 0
			? psprintf("%d s", statement_limit_ms / 1000)
			: psprintf("%d ms", statement_limit_ms);

		edata->message = psprintf("canceling statement: the sandbox's statement limit of %s was reached", limit);
		edata->detail = pstrdup("A sandbox's statements run for at most the limit it was forked with; "
								"SET statement_timeout cannot lift it (SHOW airlock.statement_limit shows it).");
		edata->hint = pstrdup("Fork the sandbox with a longer limit (airlock fork --statement-timeout 5m), "
							  "or split the work into shorter statements.");
	}
	if (edata->elevel == FATAL && edata->sqlerrcode == ERRCODE_ADMIN_SHUTDOWN &&
		edata->message_id != NULL &&
		strcmp(edata->message_id, "terminating connection due to administrator command") == 0)
	{
		const Ending *ending = ending_of_this_backend();

		if (ending != NULL)
		{
			edata->message = pstrdup(ending->message);
			edata->hint = pstrdup(ending->hint);
		}
	}
	if (previous_emit_log_hook)
		previous_emit_log_hook(edata);
}

/* Whether this session logged in as a member of the read-only role. */
static bool
read_only_session(void)
{
	Oid			role;

	if (!IsTransactionState())
		return false;
	role = get_role_oid(READ_ONLY_ROLE, true);
	return OidIsValid(role) && is_member_of_role_nosuper(GetSessionUserId(), role);
}

/* Makes the current transaction read-only if this is a read-only session. */
static void
hold_read_only(void)
{
	if (!XactReadOnly && read_only_session())
		XactReadOnly = true;
}

/* What a statement would change, if it is one this guard refuses; NULL otherwise. */
static const char *
refused_change(Node *stmt)
{
	switch (nodeTag(stmt))
	{
		case T_AlterRoleStmt:
			return "a role's password or attributes";
		case T_AlterRoleSetStmt:
			return "a role's session defaults";
		case T_AlterDatabaseStmt:
#if PG_VERSION_NUM >= 150000
		case T_AlterDatabaseRefreshCollStmt:
#endif
			return "the database's options";
		case T_AlterDatabaseSetStmt:
			return "the database's session defaults";
		case T_RenameStmt:
			if (((RenameStmt *) stmt)->renameType == OBJECT_DATABASE)
				return "the database's name";
			if (((RenameStmt *) stmt)->renameType == OBJECT_ROLE)
				return "a role's name";
			return NULL;
		case T_AlterOwnerStmt:
			if (((AlterOwnerStmt *) stmt)->objectType == OBJECT_DATABASE)
				return "the database's owner";
			return NULL;
		default:
			return NULL;
	}
}

/* Options of CREATE DATABASE that would make a database other than the agent's own. */
static const char *const refused_database_options[] = {
	"owner", "is_template", "allow_connections", "connection_limit", "tablespace", "oid",
};

/* Copies one file of the golden's template1 into this server's. */
static void
copy_template_file(const char *name)
{
	char		from[MAXPGPATH];
	char		to[MAXPGPATH];
	char		buffer[65536];
	int			in,
				out;
	ssize_t		n;

	snprintf(from, sizeof(from), "%s/%s", template_source, name);
	snprintf(to, sizeof(to), "base/%u/%s", Template1DbOid, name);
	in = open(from, O_RDONLY | O_NOFOLLOW | PG_BINARY);
	if (in < 0)
		ereport(ERROR, (errcode_for_file_access(), errmsg("could not read the template's file \"%s\": %m", from)));
	out = open(to, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | PG_BINARY, pg_file_create_mode);
	if (out < 0)
	{
		int			save = errno;

		close(in);
		errno = save;
		ereport(ERROR, (errcode_for_file_access(), errmsg("could not write \"%s\": %m", to)));
	}
	while ((n = read(in, buffer, sizeof(buffer))) > 0)
		if (write(out, buffer, n) != n)
		{
			int			save = errno ? errno : ENOSPC;

			close(in);
			close(out);
			errno = save;
			ereport(ERROR, (errcode_for_file_access(), errmsg("could not write \"%s\": %m", to)));
		}
	if (n < 0 || (strcmp(name, "PG_VERSION") == 0 && pg_fsync(out) != 0))
	{
		int			save = errno;

		close(in);
		close(out);
		errno = save;
		ereport(ERROR, (errcode_for_file_access(), errmsg("could not copy \"%s\": %m", from)));
	}
	close(in);
	close(out);
}

/* Whether the current role may create databases (CREATEDB; PostgreSQL's own check is not exported before 15). */
static bool
may_create_databases(void)
{
	HeapTuple	tuple;
	bool		createdb;

	if (superuser())
		return true;
	tuple = SearchSysCache1(AUTHOID, ObjectIdGetDatum(GetUserId()));
	if (!HeapTupleIsValid(tuple))
		return false;
	createdb = ((Form_pg_authid) GETSTRUCT(tuple))->rolcreatedb;
	ReleaseSysCache(tuple);
	return createdb;
}

/*
 * Puts template1's files in place, from the golden's, if they are not there
 * yet (PG_VERSION, copied last, says they all are). One session at a time:
 * the directory is locked meanwhile.
 */
static void
materialize_template1(void)
{
	char		directory[MAXPGPATH];
	char		marker[MAXPGPATH];
	struct stat st;
	int			lock;
	DIR		   *source;
	struct dirent *entry;

	snprintf(directory, sizeof(directory), "base/%u", Template1DbOid);
	snprintf(marker, sizeof(marker), "%s/PG_VERSION", directory);
	if (stat(marker, &st) == 0 || template_source == NULL || template_source[0] == '\0')
		return;
	/* Nothing is written for a CREATE DATABASE PostgreSQL would refuse. */
	if (XactReadOnly || !may_create_databases())
		return;
	lock = open(directory, O_RDONLY | O_DIRECTORY | O_NOFOLLOW);
	if (lock < 0)
		ereport(ERROR, (errcode_for_file_access(), errmsg("could not open \"%s\": %m", directory)));
	if (flock(lock, LOCK_EX) != 0)
	{
		int			save = errno;

		close(lock);
		errno = save;
		ereport(ERROR, (errcode_for_file_access(), errmsg("could not lock \"%s\": %m", directory)));
	}
	if (stat(marker, &st) != 0)
	{
		source = opendir(template_source);
		if (source == NULL)
		{
			close(lock);
			ereport(ERROR, (errcode_for_file_access(), errmsg("could not read the template at \"%s\": %m", template_source)));
		}
		while ((entry = readdir(source)) != NULL)
		{
			if (entry->d_name[0] == '.' || strcmp(entry->d_name, "PG_VERSION") == 0)
				continue;
			PG_TRY();
			{
				copy_template_file(entry->d_name);
			}
			PG_CATCH();
			{
				closedir(source);
				close(lock);
				PG_RE_THROW();
			}
			PG_END_TRY();
		}
		closedir(source);
		copy_template_file("PG_VERSION");
	}
	close(lock);
}


/*
 * The hand-off. The router authenticates a plaintext client itself, then
 * opens a session for it as the agent role with airlock.handoff=on in the
 * startup packet. Once that session has authenticated, and before the server
 * says anything more, the guard offers to take the client: a ParameterStatus
 * "airlock.handoff" = "PID:KEY", the backend's cancel key in hex, for the
 * router to pass the client's cancel requests on. The router answers with one
 * message: the client's socket (SCM_RIGHTS: TCP, or unix for a client of the
 * router's own unix socket) and what airlock.connection is
 * to say, which the guard sets with the handshake as the router would. The guard puts the client's socket in place of the
 * router's; AuthenticationOk and everything after go to the client, and the
 * session's bytes pass through no proxy. The router's connection stays open,
 * unused, until the session ends, which is how the router sees it end.
 *
 * Nothing here is more than a client of the socket can do already: whoever
 * connects with airlock.handoff=on gets the offer (their own session's key),
 * can say how they connected (as a direct client may, with the handshake it
 * is told) and can hand in only a stream socket of their own to talk over.
 */
static bool handoff_setting = false;
/* Whether this session took its client (what SHOW airlock.handoff says). */
static bool handoff_taken = false;

/*
 * Longest wait for the router's answer to the offer (which follows its write
 * of the connection's event): within the server's authentication_timeout
 * (10 s in a sandbox), which would end the session without a word, so that
 * the one who asked hears why.
 */
#define HANDOFF_WAIT_MS 8000
/* Longest airlock.connection text the router sends with the socket. */
#define HANDOFF_TEXT_MAX 1024

/* SHOW airlock.handoff: whether this session took its client, not whether it was asked to. */
static const char *
show_handoff(void)
{
	return handoff_taken ? "on" : "off";
}

/* Whether the startup packet asked for the hand-off (airlock.handoff=on). */
static bool
handoff_asked(Port *port)
{
	ListCell   *cell;
	bool		asked = false;

	if (port == NULL)
		return false;
	cell = list_head(port->guc_options);
	while (cell != NULL && lnext(port->guc_options, cell) != NULL)
	{
		const char *name = lfirst(cell);
		const char *value = lfirst(lnext(port->guc_options, cell));

		if (strcmp(name, "airlock.handoff") == 0)
			asked = parse_bool(value, &asked) && asked;
		cell = lnext(port->guc_options, lnext(port->guc_options, cell));
	}
	return asked;
}

/* Ends the session: the hand-off did not happen. */
static void
handoff_failed(const char *why)
{
	ereport(FATAL,
			(errcode(ERRCODE_PROTOCOL_VIOLATION),
			 errmsg("the router's hand-off of its client failed: %s", why)));
}

/* Sends the offer: this backend's pid and cancel key. */
static void
offer_handoff(void)
{
	StringInfoData message;
	StringInfoData offer;
#if PG_VERSION_NUM >= 180000
	const uint8 *key = MyCancelKey;
	int			key_length = MyCancelKeyLength;
#else
	uint8		key[4];
	int			key_length = 4;
	uint32		network = pg_hton32((uint32) MyCancelKey);

	memcpy(key, &network, 4);
#endif

	initStringInfo(&offer);
	appendStringInfo(&offer, "%d:", MyProcPid);
	for (int i = 0; i < key_length; i++)
		appendStringInfo(&offer, "%02x", key[i]);
	pq_beginmessage(&message, 'S');
	pq_sendbytes(&message, "airlock.handoff", strlen("airlock.handoff") + 1);
	pq_sendbytes(&message, offer.data, offer.len + 1);
	pq_endmessage(&message);
	if (pq_flush() != 0)
		handoff_failed("the offer could not be sent");
	pfree(offer.data);
}

/*
 * Receives the router's answer on `sock`: the client's socket, and the text
 * (NUL-terminated into `text`). Returns the socket.
 */
static int
receive_client(int sock, char *text)
{
	struct pollfd wait = {.fd = sock,.events = POLLIN};
	/* Aligned for a cmsghdr; room for one descriptor only. */
	union
	{
		char		buffer[CMSG_SPACE(sizeof(int))];
		struct cmsghdr align;
	}			control;
	struct iovec data = {.iov_base = text,.iov_len = HANDOFF_TEXT_MAX};
	struct msghdr message = {0};
	struct cmsghdr *header;
	TimestampTz deadline = TimestampTzPlusMilliseconds(GetCurrentTimestamp(), HANDOFF_WAIT_MS);
	ssize_t		got;
	int			client;

	/* Waits a second at a time, so a shutdown or the authentication timeout ends it. */
	for (;;)
	{
		long		left = TimestampDifferenceMilliseconds(GetCurrentTimestamp(), deadline);
		int			ready;

		CHECK_FOR_INTERRUPTS();
		if (left <= 0)
			handoff_failed("no answer to the offer");
		ready = poll(&wait, 1, (int) Min(left, 1000));
		if (ready > 0)
			break;
		if (ready < 0 && errno != EINTR)
			handoff_failed("waiting for the answer failed");
	}
	memset(&control, 0, sizeof(control));
	message.msg_iov = &data;
	message.msg_iovlen = 1;
	message.msg_control = control.buffer;
	message.msg_controllen = sizeof(control.buffer);
	do
		got = recvmsg(sock, &message, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
	while (got < 0 && errno == EINTR);
	if (got <= 0)
		handoff_failed("the connection ended before the answer");
	header = CMSG_FIRSTHDR(&message);
	if ((message.msg_flags & MSG_CTRUNC) != 0 || header == NULL ||
		header->cmsg_level != SOL_SOCKET || header->cmsg_type != SCM_RIGHTS ||
		header->cmsg_len != CMSG_LEN(sizeof(int)))
	{
		/*
		 * Whatever came, nothing received is kept open. The buffer holds one
		 * descriptor at most (the kernel closes any more, and says so with
		 * MSG_CTRUNC).
		 */
		if (header != NULL && header->cmsg_level == SOL_SOCKET && header->cmsg_type == SCM_RIGHTS &&
			header->cmsg_len == CMSG_LEN(sizeof(int)))
		{
			memcpy(&client, CMSG_DATA(header), sizeof(int));
			close(client);
		}
		handoff_failed("the answer was not one socket and its text");
	}
	memcpy(&client, CMSG_DATA(header), sizeof(int));
	if (got >= HANDOFF_TEXT_MAX || memchr(text, '\0', got) != NULL)
	{
		close(client);
		handoff_failed("the answer's text is too long or holds a NUL");
	}
	text[got] = '\0';
	return client;
}

/*
 * Whether `fd` is a stream socket, TCP or unix: all the router ever hands in.
 * (Not a file, a pipe or a datagram socket, which the server's socket calls
 * would fail on in ways it does not expect.)
 */
static bool
is_stream_socket(int fd)
{
	int			type = 0;
	int			domain = 0;
	socklen_t	length = sizeof(int);

	if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &length) != 0 || type != SOCK_STREAM)
		return false;
	length = sizeof(int);
	if (getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &domain, &length) != 0)
		return false;
	return domain == AF_INET || domain == AF_INET6 || domain == AF_UNIX;
}

/*
 * The backend waits on its client's socket through a wait set made at its
 * start, which holds the socket that was there then: made again for the one
 * there now, as the server makes it.
 */
static void
watch_new_client(Port *port)
{
	WaitEventSet *made;

#ifndef FeBeWaitSetNEvents
#define FeBeWaitSetNEvents 3
#endif
	/* Made whole before the old one goes, so an error leaves the old in place. */
#if PG_VERSION_NUM >= 170000
	made = CreateWaitEventSet(NULL, FeBeWaitSetNEvents);
#else
	made = CreateWaitEventSet(TopMemoryContext, FeBeWaitSetNEvents);
#endif
	AddWaitEventToSet(made, WL_SOCKET_WRITEABLE, port->sock, NULL, NULL);
	AddWaitEventToSet(made, WL_LATCH_SET, PGINVALID_SOCKET, MyLatch, NULL);
	AddWaitEventToSet(made, WL_POSTMASTER_DEATH, PGINVALID_SOCKET, NULL, NULL);
	FreeWaitEventSet(FeBeWaitSet);
	FeBeWaitSet = made;
}

/*
 * A handed-off session's handshake is never reported: its client is not the
 * router. (airlock.handshake is reported at every session's start, whatever
 * its value.)
 */
static void
stop_reporting_handshake(void)
{
#if PG_VERSION_NUM >= 160000
	struct config_generic *record = find_option("airlock.handshake", false, true, ERROR);

	if (record != NULL)
		record->flags &= ~GUC_REPORT;
#else
	struct config_generic **all = get_guc_variables();
	int			count = GetNumConfigOptions();

	for (int i = 0; i < count; i++)
		if (strcmp(all[i]->name, "airlock.handshake") == 0)
			all[i]->flags &= ~GUC_REPORT;
#endif
}

/* Takes the router's client in place of the router (see above). */
static void
take_client(Port *port)
{
	char		text[HANDOFF_TEXT_MAX + 1];
	int			client;
	int			router;
	char	   *connection;

	/* Nothing of the router's may be left unread: it would be lost. */
#if PG_VERSION_NUM >= 170000
	if (pq_buffer_remaining_data() > 0)
#else
	if (pq_buffer_has_data())
#endif
		handoff_failed("the router spoke before the offer");
	offer_handoff();
	client = receive_client(port->sock, text);
	if (!is_stream_socket(client))
	{
		close(client);
		handoff_failed("what was handed in is not a stream socket");
	}
	/* The router's connection stays open while the session lives, unused. */
	if (!AcquireExternalFD())
	{
		close(client);
		handoff_failed("no file descriptor left to keep the router's connection");
	}
	router = fcntl(port->sock, F_DUPFD_CLOEXEC, 3);
	if (router < 0 || dup2(client, port->sock) < 0)
	{
		close(client);
		handoff_failed("the client's connection could not be put in place");
	}
	close(client);
	if (!pg_set_noblock(port->sock))
		handoff_failed("the client's connection could not be made non-blocking");
	watch_new_client(port);
	stop_reporting_handshake();
	handoff_taken = true;
	/* As the router would SET it: RESET blanks it. */
	connection = psprintf("%s:%s", handshake, text);
	SetConfigOption("airlock.connection", connection, PGC_USERSET, PGC_S_SESSION);
	pfree(connection);
}

/*
 * A session that authenticated gets its handshake, reported to its client; one
 * that asked for a hand-off takes its client's connection first.
 */
static void
airlock_guard_client_auth(Port *port, int status)
{
	unsigned char bytes[16];

	if (previous_client_auth_hook)
		previous_client_auth_hook(port, status);
	if (status != STATUS_OK || !pg_strong_random(bytes, sizeof(bytes)))
		return;
	for (int i = 0; i < (int) sizeof(bytes); i++)
		snprintf(handshake + 2 * i, 3, "%02x", bytes[i]);
	/* A handed-off session's handshake is spent at once, never reported. */
	if (handoff_asked(port))
		take_client(port);
	else
		SetConfigOption("airlock.handshake", handshake, PGC_INTERNAL, PGC_S_OVERRIDE);
}

/*
 * airlock.connection takes a value only from the router: "HANDSHAKE:what", once
 * (it keeps "what"); an empty value (RESET) is always taken.
 */
static bool
check_connection(char **newval, void **extra, GucSource source)
{
	size_t		length = strlen(handshake);
	char	   *what;

	/* A parallel worker takes its leader's value, which was checked then. */
	if (*newval == NULL || (*newval)[0] == '\0' || InitializingParallelWorker)
		return true;
	if (length == 0 || strncmp(*newval, handshake, length) != 0 || (*newval)[length] != ':')
	{
		GUC_check_errmsg("airlock.connection is set by Airlock's router alone");
		GUC_check_errhint("SHOW airlock.connection says how this session's client connected.");
		return false;
	}
#if PG_VERSION_NUM >= 160000
	what = guc_strdup(LOG, *newval + length + 1);
	if (what == NULL)
		return false;
	guc_free(*newval);
#else
	what = strdup(*newval + length + 1);
	if (what == NULL)
		return false;
	free(*newval);
#endif
	*newval = what;
	memset(handshake, 0, sizeof(handshake));
	return true;
}

/* Refuses a CREATE or DROP DATABASE that goes beyond the agent's own databases. */
static void
hold_own_databases(Node *stmt)
{
	if (IsA(stmt, CreatedbStmt))
	{
		CreatedbStmt *create = (CreatedbStmt *) stmt;
		ListCell   *cell;
		bool		templated = false;

		if (GetUserId() != GetSessionUserId())
			ereport(ERROR,
					(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
					 errmsg("permission denied to create a database as another role in an Airlock sandbox"),
					 errhint("RESET ROLE first: a database is created as the session's own role.")));
		foreach(cell, create->options)
		{
			DefElem    *option = (DefElem *) lfirst(cell);

			if (strcmp(option->defname, "template") == 0)
				templated = strcmp(defGetString(option), "template1") != 0;

			for (int i = 0; i < lengthof(refused_database_options); i++)
				if (strcmp(option->defname, refused_database_options[i]) == 0)
					ereport(ERROR,
							(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
							 errmsg("permission denied to create a database with %s in an Airlock sandbox",
									option->defname),
							 errdetail("A database the agent creates is its own: owned by its role, "
									   "reachable, on the sandbox's storage."),
							 errhint("Leave out %s.", option->defname)));
		}
		if (!templated && OidIsValid(get_database_oid("template1", true)))
			materialize_template1();
		if (!templated && !OidIsValid(get_database_oid("template1", true)))
			ereport(ERROR,
					(errcode(ERRCODE_UNDEFINED_DATABASE),
					 errmsg("this sandbox has no template to create a database from"),
					 errdetail("Its golden was built before goldens kept template1."),
					 errhint("Build the golden again (airlock golden refresh NAME), or give TEMPLATE with a database of your own.")));
	}
	else if (IsA(stmt, DropdbStmt))
	{
		DropdbStmt *drop = (DropdbStmt *) stmt;
		Oid			database = get_database_oid(drop->dbname, true);
		HeapTuple	tuple;
		Oid			owner;

		if (!OidIsValid(database))
			return;
		tuple = SearchSysCache1(DATABASEOID, ObjectIdGetDatum(database));
		if (!HeapTupleIsValid(tuple))
			return;
		owner = ((Form_pg_database) GETSTRUCT(tuple))->datdba;
		ReleaseSysCache(tuple);
		if (owner != GetSessionUserId())
			ereport(ERROR,
					(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
					 errmsg("permission denied to drop database \"%s\" in an Airlock sandbox", drop->dbname),
					 errdetail("Only a database the agent created may be dropped; the sandbox's own stays."),
					 errhint("To start over, reset the sandbox (airlock reset, or the reset_database tool).")));
	}
}

static void
airlock_guard_utility(PlannedStmt *pstmt, const char *queryString,
					  UTILITY_READ_ONLY_TREE_PARAM ProcessUtilityContext context,
					  ParamListInfo params, QueryEnvironment *queryEnv,
					  DestReceiver *dest, QueryCompletion *qc)
{
	const char *change = refused_change(pstmt->utilityStmt);

	if (IsA(pstmt->utilityStmt, AlterExtensionContentsStmt) && !superuser())
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("permission denied to add objects to or drop them from an extension in an Airlock sandbox"),
				 errdetail("An extension's members are left out of Airlock's reports."),
				 errhint("Keep the object outside the extension.")));
	if (change != NULL && !superuser())
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("permission denied to change %s in an Airlock sandbox", change),
				 errdetail("Role and database settings, passwords and attributes would outlive this session."),
				 errhint("Use SET (or SET LOCAL) to change a setting for this session only.")));
	if (!superuser())
		hold_own_databases(pstmt->utilityStmt);

	hold_read_only();
	hold_statement_limit();
	if (previous_utility_hook)
		previous_utility_hook(pstmt, queryString, UTILITY_READ_ONLY_TREE_ARG context, params,
							  queryEnv, dest, qc);
	else
		standard_ProcessUtility(pstmt, queryString, UTILITY_READ_ONLY_TREE_ARG context,
								params, queryEnv, dest, qc);
	/* BEGIN READ WRITE, SET TRANSACTION and the like may have undone it. */
	hold_read_only();
}

static void
airlock_guard_executor_start(QueryDesc *queryDesc, int eflags)
{
	hold_read_only();
	hold_statement_limit();
	if (previous_executor_start_hook)
		previous_executor_start_hook(queryDesc, eflags);
	else
		standard_ExecutorStart(queryDesc, eflags);
}

#if PG_VERSION_NUM >= 180000
#define EXECUTOR_RUN_PARAMS QueryDesc *queryDesc, ScanDirection direction, uint64 count
#define EXECUTOR_RUN_ARGS queryDesc, direction, count
#else
#define EXECUTOR_RUN_PARAMS QueryDesc *queryDesc, ScanDirection direction, uint64 count, bool execute_once
#define EXECUTOR_RUN_ARGS queryDesc, direction, count, execute_once
#endif

/* A portal that runs (the extended protocol's Execute) is held to the limit too. */
static void
airlock_guard_executor_run(EXECUTOR_RUN_PARAMS)
{
	hold_statement_limit();
	if (previous_executor_run_hook)
		previous_executor_run_hook(EXECUTOR_RUN_ARGS);
	else
		standard_ExecutorRun(EXECUTOR_RUN_ARGS);
}

/* So is the making of a plan. */
static PlannedStmt *
airlock_guard_planner(Query *parse, const char *query_string, int cursorOptions, ParamListInfo boundParams)
{
	hold_statement_limit();
	if (previous_planner_hook)
		return previous_planner_hook(parse, query_string, cursorOptions, boundParams);
	return standard_planner(parse, query_string, cursorOptions, boundParams);
}

/* The built-in functions that write large objects. */
static bool
writes_large_objects(Oid function)
{
	switch (function)
	{
		case F_LO_CREAT:
		case F_LO_CREATE:
		case F_LO_FROM_BYTEA:
		case F_LO_IMPORT_TEXT:
		case F_LO_IMPORT_TEXT_OID:
		case F_LO_PUT:
		case F_LOWRITE:
		case F_LO_TRUNCATE:
		case F_LO_TRUNCATE64:
		case F_LO_UNLINK:
			return true;
		default:
			return false;
	}
}

/* Function calls, including fast-path calls (lo_creat and friends) and
 * PL/pgSQL's simple expressions, which run no executor. */
static void
airlock_guard_object_access(ObjectAccessType access, Oid classId, Oid objectId,
							int subId, void *arg)
{
	if (access == OAT_FUNCTION_EXECUTE)
	{
		hold_read_only();
		hold_statement_limit();
		if (writes_large_objects(objectId) && read_only_session())
			ereport(ERROR,
					(errcode(ERRCODE_READ_ONLY_SQL_TRANSACTION),
					 errmsg("cannot write large objects in a read-only transaction"),
					 errhint("This sandbox was forked in read-only mode.")));
	}
	if (previous_object_access_hook)
		previous_object_access_hook(access, classId, objectId, subId, arg);
}

/*
 * Ends a process of the server that is exiting through proc_exit, once every
 * clean-up PostgreSQL asked for has run. What would run after it are the
 * libraries' own exit handlers: OpenSSL's clean-up (pg_strong_random set
 * OpenSSL up at the postmaster's start) and every linked library's
 * destructors, which free memory the kernel is about to take back and, in a
 * forked process, first copy the pages they touch: about 1 ms and 300 page
 * faults a process, on every connection's end and on the start-up process's,
 * which a server's start waits for. Registered in the postmaster after those
 * handlers, so it runs before them in every process forked from it.
 *
 * It ends nothing while the shared-memory clean-up is still under way
 * (shmem_exit_inprogress): an exit() from inside one of those callbacks (an
 * extension's, an interpreter's teardown) then goes on to PostgreSQL's own
 * atexit callback, which runs what is left (ProcKill among it), as before.
 * A process that calls exit() outside proc_exit is left alone too: the
 * handlers run as they always did. stdio is flushed first, as exit() would
 * (a value `postgres -C` printed to a pipe, a collector's last line).
 */
static void
end_after_cleanup(int status, void *arg)
{
	if (proc_exit_inprogress && !shmem_exit_inprogress)
	{
		fflush(NULL);
		_exit(status);
	}
}

/*
 * A fork's server is started while the daemon still clones its files, and
 * waits here for them: the daemon preloads this library (LD_PRELOAD) and
 * hands the server one end of its gate's pipe as the descriptor named by
 * AIRLOCK_GATE_FD. The dynamic loader has mapped and linked the server's
 * forty-odd libraries by then (more CPU than the rest of its start-up), so
 * that work overlaps the clone; PostgreSQL's own code, which reads the data
 * directory, has not run. One byte 'g' lets it go on; anything else (the
 * daemon gave the fork up, or died and closed its end) ends it, as does a
 * parent that is no longer the daemon named in AIRLOCK_GATE_PARENT (it died
 * after its word, perhaps before the clone was done). The variables go
 * first, so nothing the server starts inherits them.
 *
 * Run from shared_preload_libraries instead (the preload failed: the loader
 * says so and goes on), PostgreSQL has already read files the clone may not
 * have finished: the server ends rather than wait there.
 */
static void __attribute__((constructor))
wait_at_gate(void)
{
	const char *named = getenv("AIRLOCK_GATE_FD");
	const char *parent = getenv("AIRLOCK_GATE_PARENT");
	char		word = 0;
	ssize_t		n;
	int			fd;
	long		daemon;

	if (named == NULL)
		return;
	if (process_shared_preload_libraries_in_progress)
	{
		fprintf(stderr, "airlock_guard: the server was not held at its gate (the guard was not preloaded); stopping\n");
		_exit(3);
	}
	fd = atoi(named);
	daemon = parent ? atol(parent) : 0;
	unsetenv("AIRLOCK_GATE_FD");
	unsetenv("AIRLOCK_GATE_PARENT");
	unsetenv("LD_PRELOAD");
	do
		n = read(fd, &word, 1);
	while (n < 0 && errno == EINTR);
	close(fd);
	if (n != 1 || word != 'g' || (daemon != 0 && (long) getppid() != daemon))
		_exit(3);
}

void
_PG_init(void)
{
	if (!process_shared_preload_libraries_in_progress)
		ereport(ERROR,
				(errmsg("airlock_guard must be loaded with shared_preload_libraries")));
	forget_old_endings();
	previous_utility_hook = ProcessUtility_hook;
	ProcessUtility_hook = airlock_guard_utility;
	previous_executor_start_hook = ExecutorStart_hook;
	ExecutorStart_hook = airlock_guard_executor_start;
	previous_executor_run_hook = ExecutorRun_hook;
	ExecutorRun_hook = airlock_guard_executor_run;
	previous_planner_hook = planner_hook;
	planner_hook = airlock_guard_planner;
	previous_object_access_hook = object_access_hook;
	object_access_hook = airlock_guard_object_access;
	previous_emit_log_hook = emit_log_hook;
	emit_log_hook = airlock_guard_emit_log;
	previous_client_auth_hook = ClientAuthentication_hook;
	ClientAuthentication_hook = airlock_guard_client_auth;
	DefineCustomStringVariable("airlock.handshake",
							   "This session's handshake with Airlock's router.",
							   NULL,
							   &handshake_setting, "", PGC_INTERNAL,
							   GUC_REPORT | GUC_NO_SHOW_ALL | GUC_SUPERUSER_ONLY | GUC_NOT_IN_SAMPLE | GUC_DISALLOW_IN_FILE,
							   NULL, NULL, NULL);
	DefineCustomStringVariable("airlock.connection",
							   "How this session's client reached Airlock: via the router, its address, TLS and channel binding.",
							   "Set by Airlock's router; empty for a session that did not come through it.",
							   &connection_setting, "", PGC_USERSET, GUC_NOT_IN_SAMPLE | GUC_DISALLOW_IN_FILE,
							   check_connection, NULL, NULL);
	DefineCustomBoolVariable("airlock.handoff",
							 "Whether this session's client was handed to it by Airlock's router.",
							 "Asked for by the router in the startup packet; see the guard's source.",
							 &handoff_setting, false, PGC_BACKEND, GUC_NOT_IN_SAMPLE | GUC_DISALLOW_IN_FILE,
							 NULL, NULL, show_handoff);
	DefineCustomStringVariable("airlock.template_source",
							   "Where the golden's template1 files are, to copy at the first CREATE DATABASE.",
							   "Set by Airlock when it starts the server.",
							   &template_source, "", PGC_POSTMASTER, 0,
							   NULL, NULL, NULL);
	DefineCustomIntVariable("airlock.statement_limit",
							"The sandbox's statement limit, which SET statement_timeout cannot lift.",
							"Set by Airlock as the agent role's default; 0 turns it off.",
							&statement_limit_ms, 0, 0, INT_MAX, PGC_SUSET, GUC_UNIT_MS,
							NULL, NULL, NULL);
	if (on_exit(end_after_cleanup, NULL) != 0)
		elog(WARNING, "airlock_guard: processes will run their libraries' exit handlers");
}
