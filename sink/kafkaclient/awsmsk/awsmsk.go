// Package awsmsk supplies the credentials of SASL AWS_MSK_IAM (Amazon MSK's IAM
// access control) to franz-go's mechanism (pkg/sasl/aws), which signs them
// (AWS Signature Version 4) for each connection.
//
// Credentials are found as the AWS SDKs find their first two sources, and only
// those: the environment (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY and, for
// temporary credentials, AWS_SESSION_TOKEN), else the static keys of a profile
// in the shared credentials file (AWS_SHARED_CREDENTIALS_FILE, default
// ~/.aws/credentials; profile AWS_PROFILE, default "default"). The SDKs' other
// sources (web identity / IRSA, the ECS and EC2 metadata endpoints, SSO,
// assumed roles and credential_process) are not read: they need the AWS SDK,
// which the relay does not carry; their credentials can be exported into the
// environment (`aws configure export-credentials --format env`).
//
// Invariants:
//   - Credentials are looked up again for every authentication: a credentials
//     file rewritten by whatever rotates it is followed without a restart.
//   - The region is the broker host's (MSK's broker names end in
//     .kafka.<region>.amazonaws.com), else AWS_REGION or AWS_DEFAULT_REGION;
//     CheckRegion says at start-up when there is none.
package awsmsk

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"

	"github.com/twmb/franz-go/pkg/sasl"
	"github.com/twmb/franz-go/pkg/sasl/aws"
)

// ErrNoCredentials is wrapped by Credentials' error when no source holds them.
var ErrNoCredentials = errors.New("no AWS credentials")

// Mechanism is SASL AWS_MSK_IAM for kgo.SASL, with Credentials read for every
// authentication.
func Mechanism() sasl.Mechanism {
	return aws.ManagedStreamingIAM(func(context.Context) (aws.Auth, error) {
		return Credentials()
	})
}

// Credentials returns the credentials of the environment, else of the shared
// credentials file's profile (see the package doc).
func Credentials() (aws.Auth, error) {
	id, secret := os.Getenv("AWS_ACCESS_KEY_ID"), os.Getenv("AWS_SECRET_ACCESS_KEY")
	switch {
	case id != "" && secret != "":
		return aws.Auth{AccessKey: id, SecretKey: secret, SessionToken: os.Getenv("AWS_SESSION_TOKEN")}, nil
	case id != "" || secret != "":
		return aws.Auth{}, fmt.Errorf("awsmsk: only one of AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY is set: set both (and AWS_SESSION_TOKEN for temporary credentials), or neither to use a profile")
	}
	return fromFile()
}

func fromFile() (aws.Auth, error) {
	path := os.Getenv("AWS_SHARED_CREDENTIALS_FILE")
	if path == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			return aws.Auth{}, fmt.Errorf("awsmsk: %w: AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY are not set, and there is no home directory for ~/.aws/credentials (%v): set them, or AWS_SHARED_CREDENTIALS_FILE", ErrNoCredentials, err)
		}
		path = filepath.Join(home, ".aws", "credentials")
	}
	profile := os.Getenv("AWS_PROFILE")
	if profile == "" {
		profile = os.Getenv("AWS_DEFAULT_PROFILE")
	}
	if profile == "" {
		profile = "default"
	}
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return aws.Auth{}, fmt.Errorf("awsmsk: %w: AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY are not set and there is no %s: set them "+
			"(roles, IRSA, SSO and instance profiles need the AWS SDK, which the relay does not carry: export their credentials with `aws configure export-credentials --format env`)", ErrNoCredentials, path)
	}
	if err != nil {
		return aws.Auth{}, fmt.Errorf("awsmsk: read the AWS credentials file: %w: make it readable by the relay's user", err)
	}
	defer f.Close()
	keys, found, err := section(f, profile)
	if err != nil {
		return aws.Auth{}, fmt.Errorf("awsmsk: read %s: %w", path, err)
	}
	auth := aws.Auth{AccessKey: keys["aws_access_key_id"], SecretKey: keys["aws_secret_access_key"], SessionToken: keys["aws_session_token"]}
	switch {
	case !found:
		return aws.Auth{}, fmt.Errorf("awsmsk: %w: AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY are not set and %s has no profile [%s]: set them, or AWS_PROFILE to a profile of that file", ErrNoCredentials, path, profile)
	case auth.AccessKey == "" || auth.SecretKey == "":
		return aws.Auth{}, fmt.Errorf("awsmsk: %w: profile [%s] of %s has no aws_access_key_id and aws_secret_access_key: "+
			"a profile that assumes a role or uses SSO or credential_process needs the AWS SDK, which the relay does not carry; "+
			"export its credentials into the environment (`aws configure export-credentials --profile %s --format env`)", ErrNoCredentials, profile, path, profile)
	}
	return auth, nil
}

// section reads the keys of [name] in an INI file as the AWS credentials file
// writes it: key = value lines, # and ; comments.
func section(f *os.File, name string) (map[string]string, bool, error) {
	keys := map[string]string{}
	found, in := false, false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		switch {
		case line == "" || line[0] == '#' || line[0] == ';':
		case line[0] == '[' && strings.HasSuffix(line, "]"):
			in = strings.TrimSpace(line[1:len(line)-1]) == name
			found = found || in
		case in:
			if k, v, ok := strings.Cut(line, "="); ok {
				keys[strings.ToLower(strings.TrimSpace(k))] = strings.TrimSpace(v)
			}
		}
	}
	return keys, found, sc.Err()
}

// suffixes are the AWS partitions' DNS suffixes franz-go reads a region from.
var suffixes = []string{".amazonaws.com", ".amazonaws.com.cn", ".c2s.ic.gov", ".sc2s.sgov.gov"}

// CheckRegion returns an error when a broker's host names no region and neither
// AWS_REGION nor AWS_DEFAULT_REGION is set: the signature needs one.
func CheckRegion(brokers []string) error {
	if os.Getenv("AWS_REGION") != "" || os.Getenv("AWS_DEFAULT_REGION") != "" {
		return nil
	}
	for _, b := range brokers {
		host, _, err := net.SplitHostPort(b)
		if err != nil {
			host = b
		}
		named := false
		for _, s := range suffixes {
			rest, ok := strings.CutSuffix(host, s)
			named = named || (ok && strings.Contains(rest, "."))
		}
		if !named {
			return fmt.Errorf("awsmsk: the broker %s names no AWS region (MSK's broker names end in .kafka.<region>.amazonaws.com): use MSK's broker names, or set AWS_REGION", b)
		}
	}
	return nil
}
