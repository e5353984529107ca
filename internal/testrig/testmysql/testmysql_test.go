package testmysql

import (
	"context"
	"strings"
	"testing"
)

// TestStart: the server accepts the endpoint Start returns (its user's
// password checked) and refuses it with a wrong password; it listens on no
// TCP port.
func TestStart(t *testing.T) {
	ep := Start(t)
	ctx := context.Background()
	db := Open(t, ep)
	defer db.Close()
	var who, dbName string
	var skip int
	if err := db.QueryRowContext(ctx, "SELECT SUBSTRING_INDEX(CURRENT_USER(), '@', 1), DATABASE(), @@skip_networking").Scan(&who, &dbName, &skip); err != nil {
		t.Fatal(err)
	}
	if who != User || dbName != Database || skip != 1 {
		t.Fatalf("connected as %s to %s, skip_networking %d; want %s, %s, 1", who, dbName, skip, User, Database)
	}
	wrong := strings.Replace(ep, Password(t, ep), "wrong", 1)
	db2 := Open(t, wrong)
	defer db2.Close()
	if err := db2.PingContext(ctx); err == nil {
		t.Fatal("connected with a wrong password")
	}
}
