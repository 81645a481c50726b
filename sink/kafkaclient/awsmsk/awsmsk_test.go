package awsmsk_test

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/sink/kafkaclient/awsmsk"
)

// No AWS is reachable from the tests: what they prove is that the relay hands
// franz-go the credentials an operator configured, that the first SASL message
// is the signed request MSK's IAM login expects (version 2020_10_22,
// kafka-cluster:Connect, SigV4 over the host header), and that the signature
// is the one AWS would compute from those credentials. The signature is
// recomputed here from the AWS documentation's steps, not with franz-go's code.

// clearAWS empties the AWS variables the package reads, for this test only.
func clearAWS(t *testing.T) {
	t.Helper()
	for _, k := range []string{"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
		"AWS_SHARED_CREDENTIALS_FILE", "AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_REGION", "AWS_DEFAULT_REGION"} {
		t.Setenv(k, "")
	}
	t.Setenv("HOME", t.TempDir())
}

// firstMessage runs the mechanism against host and decodes its first message.
func firstMessage(t *testing.T, host string) map[string]string {
	t.Helper()
	_, first, err := awsmsk.Mechanism().Authenticate(context.Background(), host)
	if err != nil {
		t.Fatalf("Authenticate(%s): %v", host, err)
	}
	var msg map[string]string
	if err := json.Unmarshal(first, &msg); err != nil {
		t.Fatalf("the first SASL message is not a JSON object of strings: %v: %s", err, first)
	}
	return msg
}

func hmacSHA256(key []byte, s string) []byte {
	h := hmac.New(sha256.New, key)
	h.Write([]byte(s))
	return h.Sum(nil)
}

// verify checks msg is a request MSK accepts for the key pair and region:
// every field MSK's IAM authenticator reads, and a SigV4 signature that
// matches the one computed from secret.
func verify(t *testing.T, msg map[string]string, host, region, accessKey, secret, token string) {
	t.Helper()
	want := map[string]string{
		"version":             "2020_10_22",
		"host":                host,
		"action":              "kafka-cluster:Connect",
		"x-amz-algorithm":     "AWS4-HMAC-SHA256",
		"x-amz-signedheaders": "host",
	}
	for k, v := range want {
		if msg[k] != v {
			t.Errorf("%s = %q; want %q (message %v)", k, msg[k], v, msg)
		}
	}
	if token == "" {
		if _, ok := msg["x-amz-security-token"]; ok {
			t.Errorf("x-amz-security-token sent for long-term credentials: %v", msg)
		}
	} else if msg["x-amz-security-token"] != token {
		t.Errorf("x-amz-security-token = %q; want the session token %q", msg["x-amz-security-token"], token)
	}
	date := msg["x-amz-date"]
	ts, err := time.Parse("20060102T150405Z", date)
	if err != nil || time.Since(ts).Abs() > time.Minute {
		t.Fatalf("x-amz-date = %q (%v); want now, as 20060102T150405Z", date, err)
	}
	scope := date[:8] + "/" + region + "/kafka-cluster/aws4_request"
	if cred := msg["x-amz-credential"]; cred != accessKey+"/"+scope {
		t.Errorf("x-amz-credential = %q; want %q", cred, accessKey+"/"+scope)
	}
	if msg["x-amz-expires"] == "" || msg["user-agent"] == "" {
		t.Errorf("x-amz-expires %q, user-agent %q; want both set", msg["x-amz-expires"], msg["user-agent"])
	}
	sig := msg["x-amz-signature"]
	if !regexp.MustCompile(`^[0-9a-f]{64}$`).MatchString(sig) {
		t.Fatalf("x-amz-signature = %q; want 64 hex digits", sig)
	}

	// AWS SigV4: canonical request, string to sign, signing key, signature.
	q := url.Values{}
	for k, v := range map[string]string{
		"Action": msg["action"], "X-Amz-Algorithm": msg["x-amz-algorithm"], "X-Amz-Credential": msg["x-amz-credential"],
		"X-Amz-Date": date, "X-Amz-Expires": msg["x-amz-expires"], "X-Amz-SignedHeaders": "host",
	} {
		q.Set(k, v)
	}
	if token != "" {
		q.Set("X-Amz-Security-Token", token)
	}
	keys := make([]string, 0, len(q))
	for k := range q {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var pairs []string
	for _, k := range keys {
		pairs = append(pairs, url.QueryEscape(k)+"="+strings.ReplaceAll(url.QueryEscape(q.Get(k)), "+", "%20"))
	}
	emptyBody := sha256.Sum256(nil)
	canonical := "GET\n/\n" + strings.Join(pairs, "&") + "\nhost:" + host + "\n\nhost\n" + hex.EncodeToString(emptyBody[:])
	ch := sha256.Sum256([]byte(canonical))
	toSign := "AWS4-HMAC-SHA256\n" + date + "\n" + scope + "\n" + hex.EncodeToString(ch[:])
	key := hmacSHA256([]byte("AWS4"+secret), date[:8])
	key = hmacSHA256(key, region)
	key = hmacSHA256(key, "kafka-cluster")
	key = hmacSHA256(key, "aws4_request")
	if want := hex.EncodeToString(hmacSHA256(key, toSign)); sig != want {
		t.Errorf("x-amz-signature = %s; the SigV4 signature of these credentials is %s", sig, want)
	}
}

// TestMechanismEnvironment: credentials from the environment, temporary ones
// with their session token, the region from MSK's broker name.
func TestMechanismEnvironment(t *testing.T) {
	clearAWS(t)
	t.Setenv("AWS_ACCESS_KEY_ID", "AKIAEXAMPLEENV")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "secret/env+key")
	t.Setenv("AWS_SESSION_TOKEN", "session token/+=")
	if got := awsmsk.Mechanism().Name(); got != "AWS_MSK_IAM" {
		t.Fatalf("Name() = %q; want AWS_MSK_IAM", got)
	}
	host := "b-1.relay.abc123.c3.kafka.eu-west-1.amazonaws.com"
	msg := firstMessage(t, host+":9098")
	verify(t, msg, host, "eu-west-1", "AKIAEXAMPLEENV", "secret/env+key", "session token/+=")
}

// TestMechanismCredentialsFile: the profile of the shared credentials file,
// read again for each login (a rotated file is followed), and AWS_REGION for
// a broker name that names no region.
func TestMechanismCredentialsFile(t *testing.T) {
	clearAWS(t)
	path := filepath.Join(t.TempDir(), "credentials")
	write := func(id, secret string) {
		t.Helper()
		body := "[default]\naws_access_key_id = AKIADEFAULT\naws_secret_access_key = default\n\n" +
			"# the relay's\n[relay]\naws_access_key_id = " + id + "\naws_secret_access_key = " + secret + "\n"
		if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("AKIAFIRST", "first-secret")
	t.Setenv("AWS_SHARED_CREDENTIALS_FILE", path)
	t.Setenv("AWS_PROFILE", "relay")
	t.Setenv("AWS_REGION", "us-east-2")
	if err := awsmsk.CheckRegion([]string{"broker.internal:9098"}); err != nil {
		t.Fatalf("CheckRegion with AWS_REGION set: %v", err)
	}
	verify(t, firstMessage(t, "broker.internal:9098"), "broker.internal", "us-east-2", "AKIAFIRST", "first-secret", "")
	write("AKIASECOND", "second-secret")
	verify(t, firstMessage(t, "broker.internal:9098"), "broker.internal", "us-east-2", "AKIASECOND", "second-secret", "")
}

// TestCredentialsErrors: each missing or half-set source says what to set.
func TestCredentialsErrors(t *testing.T) {
	clearAWS(t)
	if _, err := awsmsk.Credentials(); !errors.Is(err, awsmsk.ErrNoCredentials) || !strings.Contains(err.Error(), "AWS_ACCESS_KEY_ID") {
		t.Errorf("no credentials anywhere: %v; want ErrNoCredentials naming AWS_ACCESS_KEY_ID", err)
	}
	t.Setenv("AWS_ACCESS_KEY_ID", "AKIAONLY")
	if _, err := awsmsk.Credentials(); err == nil || !strings.Contains(err.Error(), "set both") {
		t.Errorf("only the key id set: %v; want an error saying to set both", err)
	}
	t.Setenv("AWS_ACCESS_KEY_ID", "")
	path := filepath.Join(t.TempDir(), "credentials")
	if err := os.WriteFile(path, []byte("[sso]\nsso_session = corp\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("AWS_SHARED_CREDENTIALS_FILE", path)
	t.Setenv("AWS_PROFILE", "sso")
	if _, err := awsmsk.Credentials(); !errors.Is(err, awsmsk.ErrNoCredentials) || !strings.Contains(err.Error(), "export-credentials") {
		t.Errorf("an SSO profile: %v; want ErrNoCredentials pointing at aws configure export-credentials", err)
	}
	t.Setenv("AWS_PROFILE", "missing")
	if _, err := awsmsk.Credentials(); !errors.Is(err, awsmsk.ErrNoCredentials) || !strings.Contains(err.Error(), "[missing]") {
		t.Errorf("a profile the file lacks: %v; want ErrNoCredentials naming it", err)
	}
	if err := awsmsk.CheckRegion([]string{"b-1.relay.kafka.eu-west-1.amazonaws.com:9098"}); err != nil {
		t.Errorf("CheckRegion of an MSK broker name: %v; want nil", err)
	}
	if err := awsmsk.CheckRegion([]string{"10.0.0.7:9098"}); err == nil || !strings.Contains(err.Error(), "AWS_REGION") {
		t.Errorf("CheckRegion of an address without region, AWS_REGION unset: %v; want an error naming AWS_REGION", err)
	}
}
