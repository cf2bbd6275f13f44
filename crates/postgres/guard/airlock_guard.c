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
 */
#include "postgres.h"

#include "access/xact.h"
#include "catalog/objectaccess.h"
#include "executor/executor.h"
#include "fmgr.h"
#include "miscadmin.h"
#include "nodes/parsenodes.h"
#include "tcop/utility.h"
#include "utils/acl.h"
#include "utils/fmgroids.h"

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

PG_MODULE_MAGIC;

void _PG_init(void);

/* Membership in this role makes a session read-only for good. */
#define READ_ONLY_ROLE "airlock_readonly"

static ProcessUtility_hook_type previous_utility_hook = NULL;
static ExecutorStart_hook_type previous_executor_start_hook = NULL;
static object_access_hook_type previous_object_access_hook = NULL;

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

	hold_read_only();
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
	if (previous_executor_start_hook)
		previous_executor_start_hook(queryDesc, eflags);
	else
		standard_ExecutorStart(queryDesc, eflags);
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
		if (writes_large_objects(objectId) && read_only_session())
			ereport(ERROR,
					(errcode(ERRCODE_READ_ONLY_SQL_TRANSACTION),
					 errmsg("cannot write large objects in a read-only transaction"),
					 errhint("This sandbox was forked in read-only mode.")));
	}
	if (previous_object_access_hook)
		previous_object_access_hook(access, classId, objectId, subId, arg);
}

void
_PG_init(void)
{
	if (!process_shared_preload_libraries_in_progress)
		ereport(ERROR,
				(errmsg("airlock_guard must be loaded with shared_preload_libraries")));
	previous_utility_hook = ProcessUtility_hook;
	ProcessUtility_hook = airlock_guard_utility;
	previous_executor_start_hook = ExecutorStart_hook;
	ExecutorStart_hook = airlock_guard_executor_start;
	previous_object_access_hook = object_access_hook;
	object_access_hook = airlock_guard_object_access;
}
