package command

import "kube-etcd-migrate/internal/input"

// inputFlags spells each input the library's messages refer to as the flag
// that gives it (TestEveryInputHasAFlag keeps it whole).
var inputFlags = map[input.Name]string{
	input.AllowLiveAPIServer:       "--allow-live-apiserver",
	input.AllowUnverifiedJournal:   "--allow-unverified-journal",
	input.APIServerFlagsFile:       "--apiserver-flags-file",
	input.APIServerManifest:        "--apiserver-manifest",
	input.CACert:                   "--cacert",
	input.ClientCert:               "--cert",
	input.ClientKey:                "--key",
	input.CompactHistory:           "--compact-history",
	input.ConversionWebhook:        "--conversion-webhook",
	input.Distribution:             "--distribution",
	input.EncryptionProviderConfig: "--encryption-provider-config",
	input.Endpoints:                "--endpoints",
	input.FailFast:                 "--fail-fast",
	input.FailOnOrphaned:           "--fail-on-orphaned",
	input.FeatureGates:             "--feature-gates",
	input.Force:                    "--force",
	input.Journal:                  "--journal",
	input.Namespace:                "--namespace",
	input.NoUndo:                   "--no-undo",
	input.NodeRoot:                 "--node-root",
	input.OutputSnapshot:           "--output-snapshot",
	input.QuotaBackendBytes:        "--quota-backend-bytes",
	input.Record:                   "--record",
	input.Requested:                "--requested",
	input.Resource:                 "--resource",
	input.Revision:                 "--revision",
	input.RuntimeConfig:            "--runtime-config",
	input.SkipHashCheck:            "--skip-hash-check",
	input.Snapshot:                 "--snapshot",
	input.SnapshotFile:             "--snapshot-file",
	input.StateDir:                 "--state-dir",
	input.StorageMediaType:         "--storage-media-type",
	input.TargetVersion:            "--target-version",
	input.UndoDir:                  "--undo-dir",
	input.User:                     "--user",
}

// flagOf is the flag of an input (its words if it has none).
func flagOf(n input.Name) string {
	if f, ok := inputFlags[n]; ok {
		return f
	}
	return input.Words(n)
}

// cliMessage is err's message as the command line says it: every input the
// library's messages refer to named by its flag.
func cliMessage(err error) string { return input.RenderAll(err, flagOf) }
