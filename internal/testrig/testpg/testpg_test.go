package testpg

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
)

// TestStart: the server accepts the DSN Start returns (its role's
// password checked: scram-sha-256) and refuses it with a wrong password;
// it listens on no TCP port.
func TestStart(t *testing.T) {
	dsn := Start(t)
	ctx := context.Background()
	c, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	var who, db, listen string
	if err := c.QueryRow(ctx, "SELECT current_user, current_database(), current_setting('listen_addresses')").Scan(&who, &db, &listen); err != nil {
		t.Fatal(err)
	}
	if who != Role || db != Database || listen != "" {
		t.Fatalf("connected as %s to %s, listen_addresses %q; want %s, %s, none", who, db, listen, Role, Database)
	}
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	wrong := strings.Replace(dsn, cfg.Password, "wrong", 1)
	if c2, err := pgx.Connect(ctx, wrong); err == nil {
		c2.Close(ctx)
		t.Fatal("connected with a wrong password")
	}
}
