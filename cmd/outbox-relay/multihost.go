package main

import (
	"errors"
	"fmt"
	"reflect"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outbox-relay/outbox-relay/replication/pgslot"
)

// checkMultiHost refuses a postgres.dsn that names several hosts without
// target_session_attrs=read-write (or primary): pgx takes the first host that
// answers, which may be a standby, where the relay can neither stream its slot
// nor save its checkpoint. The check compares pgx's validator, so that
// PGTARGETSESSIONATTRS counts too.
func checkMultiHost(dsn string) error {
	hosts, err := pgslot.Hosts(dsn)
	if err != nil || len(hosts) < 2 {
		return nil
	}
	pc, err := pgconn.ParseConfig(dsn)
	if err != nil {
		return nil // checkDSN reports it
	}
	v := reflect.ValueOf(pc.ValidateConnect).Pointer()
	if pc.ValidateConnect != nil && (v == reflect.ValueOf(pgconn.ValidateConnectTargetSessionAttrsReadWrite).Pointer() ||
		v == reflect.ValueOf(pgconn.ValidateConnectTargetSessionAttrsPrimary).Pointer()) {
		return nil
	}
	return fmt.Errorf("postgres.dsn names %d hosts but not target_session_attrs=read-write: the relay would connect to the first host that answers, "+
		"which may be a standby; add target_session_attrs=read-write (keyword form) or ?target_session_attrs=read-write (URL form)", len(hosts))
}

// checkReplicationDSN checks postgres.replication_dsn ("" for none) as
// postgres.dsn is checked, under its own key.
func checkReplicationDSN(dsn string) error {
	if dsn == "" {
		return nil
	}
	err := checkDSN(dsn)
	if err == nil {
		err = checkMultiHost(dsn)
	}
	if err == nil {
		return nil
	}
	// The checks name postgres.dsn; the text after the key stays.
	return errors.New("postgres.replication_dsn" + strings.TrimPrefix(err.Error(), "postgres.dsn"))
}
