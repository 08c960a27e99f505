package shards_test

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kafkatx/kafkatx/internal/testenv"
	"github.com/kafkatx/kafkatx/shards"
)

// ParseSpecs refuses each bad --shard with the spec's position or name and never the URL (a
// password in it stays out of the message).
func TestParseSpecsRefusesWithoutQuotingTheURL(t *testing.T) {
	for _, c := range []struct {
		specs []string
		want  string
	}{
		{[]string{"s1"}, "--shard 1: want NAME=URL"},
		{[]string{"s1="}, "--shard 1: want NAME=URL"},
		{[]string{"=postgres://u:s3cret@h/x"}, "--shard 1: empty shard name"},
		{[]string{"a b=postgres://u:s3cret@h/x"}, "white space"},
		{[]string{"a=postgres://u:s3cret@h/x", "a=postgres://u:s3cret@h/y"}, `shard "a" named twice`},
		{[]string{"a=postgres://u:s3cret@h/x?sslmode=bogus"}, "--shard a: "},
	} {
		_, err := shards.ParseSpecs(c.specs)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("ParseSpecs(%q) = %v; want an error with %q", c.specs, err, c.want)
			continue
		}
		if strings.Contains(err.Error(), "s3cret") {
			t.Errorf("ParseSpecs(%q) quotes the password: %v", c.specs, err)
		}
	}
	got, err := shards.ParseSpecs([]string{"s1=postgres://h/x", "s2=postgres://h/y?pool_max_conns=3"})
	if err != nil || len(got) != 2 || got[0] != (shards.Spec{Name: "s1", URL: "postgres://h/x"}) || got[1].Name != "s2" {
		t.Fatalf("ParseSpecs = %+v, %v", got, err)
	}
}

// Open shares the directory's pool with a shard on the same URL, gives the others a pool of
// their own with the connection budget (MinConns unless the URL sets pool_max_conns), and
// Close closes only what it opened. A shard that cannot connect fails the whole Open, naming
// the shard and not the password, and leaves nothing open.
func TestOpenSharesTheDirectoryAndBudgetsEachShard(t *testing.T) {
	url := testenv.Database(t)
	ctx := context.Background()
	dir, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer dir.Close()
	u2, u3 := testenv.Database(t), testenv.Database(t)
	sep := "?"
	if strings.Contains(u3, "?") {
		sep = "&"
	}
	specs, err := shards.ParseSpecs([]string{"s1=" + url, "s2=" + u2, "s3=" + u3 + sep + "pool_max_conns=2"})
	if err != nil {
		t.Fatal(err)
	}
	var configured []string
	set, err := shards.Open(ctx, specs, shards.OpenOptions{Directory: dir, DirectoryURL: url, MinConns: 7,
		Configure: func(name string, _ *pgxpool.Config) { configured = append(configured, name) }})
	if err != nil {
		t.Fatal(err)
	}
	if err := set.Validate(); err != nil {
		t.Fatal(err)
	}
	if set.Pool("s1") != dir {
		t.Error("s1, on the directory's URL, does not share the directory's pool")
	}
	if got := set.Pool("s2").Config().MaxConns; got < 7 {
		t.Errorf("s2's budget is %d connections; want at least MinConns 7", got)
	}
	if got := set.Pool("s3").Config().MaxConns; got != 2 {
		t.Errorf("s3's budget is %d connections; want its URL's pool_max_conns 2", got)
	}
	if strings.Join(configured, ",") != "s2,s3" {
		t.Errorf("Configure called for %v; want the shards Open opened: s2, s3", configured)
	}
	s2 := set.Pool("s2")
	set.Close()
	if err := s2.Ping(ctx); err == nil {
		t.Error("s2's pool still answers after Set.Close")
	}
	if err := dir.Ping(ctx); err != nil {
		t.Errorf("Set.Close closed the directory's pool: %v", err)
	}

	bad := strings.Replace(url, "://", "://nobody_kx:s3cret-pw@", 1)
	if i := strings.Index(url, "@"); i >= 0 {
		bad = url[:strings.Index(url, "://")+3] + "nobody_kx:s3cret-pw" + url[i:]
	}
	specs, err = shards.ParseSpecs([]string{"s2=" + u2, "broken=" + bad})
	if err != nil {
		t.Fatal(err)
	}
	set, err = shards.Open(ctx, specs, shards.OpenOptions{Directory: dir, DirectoryURL: url})
	if err == nil {
		set.Close()
		t.Fatal("Open succeeded with a shard whose role does not exist")
	}
	if !strings.HasPrefix(err.Error(), "shard broken: ") || strings.Contains(err.Error(), "s3cret-pw") {
		t.Errorf("Open's error = %v; want it to name shard broken and not the password", err)
	}
}

// Two shard names for one database (two URLs for it) are refused at Open: a move between them
// locked the partition's watermark row on the source and then waited for it on the "target"
// forever.
func TestOpenRefusesOneDatabaseUnderTwoNames(t *testing.T) {
	url := testenv.Database(t)
	ctx := context.Background()
	dir, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer dir.Close()
	sep := "?"
	if strings.Contains(url, "?") {
		sep = "&"
	}
	specs, err := shards.ParseSpecs([]string{"a=" + url, "b=" + url + sep + "application_name=b", "c=" + testenv.Database(t)})
	if err != nil {
		t.Fatal(err)
	}
	set, err := shards.Open(ctx, specs, shards.OpenOptions{Directory: dir, DirectoryURL: url})
	if err == nil {
		set.Close()
		t.Fatal("Open took shards a and b, one database")
	}
	if !strings.Contains(err.Error(), "shards a and b are one database") {
		t.Errorf("Open's error = %v; want it to name shards a and b", err)
	}
	if err := dir.Ping(ctx); err != nil {
		t.Errorf("the refusal closed the directory's pool: %v", err)
	}
	specs, _ = shards.ParseSpecs([]string{"a=" + url, "c=" + testenv.Database(t)})
	set, err = shards.Open(ctx, specs, shards.OpenOptions{Directory: dir, DirectoryURL: url})
	if err != nil {
		t.Fatalf("two databases of one server refused: %v", err)
	}
	set.Close()
}
