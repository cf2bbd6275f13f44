//! The target check's tests.

use super::*;

#[test]
fn default_privileges_of_whoever_ran_the_file_are_alike() {
    let change = |role: &str| Change {
        object: String::new(),
        name: format!("default privileges on new relations belonging to role {role}"),
        change: "added".into(),
        before: None,
        after: Some(format!("{{=r/{role},{role}=arwdDxt/{role}}}")),
    };
    let test = entries(&[change("airlock_agent")], &["airlock_owner", "airlock_agent"]);
    assert_eq!(test, entries(&[change("app_owner")], &["app_owner"]));
    // Another role's, named by FOR ROLE, stays that role's.
    assert_ne!(test, entries(&[change("app_owner")], &["app_admin"]));
}

#[test]
fn owners_are_set_aside_but_other_holders_are_not() {
    let test = "owner airlock_agent; grants airlock_agent=arwdDxt/airlock_agent; persistence p";
    let prod = "owner app_owner; grants app_owner=arwdDxt/app_owner; persistence p";
    assert_eq!(without_owners(test), without_owners(prod));
    let public = "owner app_owner; grants app_owner=arwdDxt/app_owner,=arwdDxt/app_owner; persistence p";
    assert_ne!(without_owners(test), without_owners(public));
    // The owner's own privileges may be shown or not: either way, the same.
    assert_eq!(without_owners("owner a; grants a=arwdDxt/a"), without_owners("owner b"));
}
