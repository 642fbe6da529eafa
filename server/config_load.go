package server

import (
	"errors"
	"fmt"
	"math"
	"os"
	"reflect"
	"regexp"
	"slices"
	"strings"

	"github.com/go-viper/mapstructure/v2"
	"github.com/knadh/koanf/parsers/yaml"
	"github.com/knadh/koanf/providers/env/v2"
	"github.com/knadh/koanf/providers/file"
	"github.com/knadh/koanf/providers/posflag"
	"github.com/knadh/koanf/v2"
	"github.com/spf13/pflag"
	"github.com/walcast/walcast/internal/editdist"
)

// Load is LoadWithWarnings without the warnings.
func Load(path string, environ []string, fs *pflag.FlagSet, flagKey func(string) string) (Config, error) {
	c, _, err := LoadWithWarnings(path, environ, fs, flagKey)
	return c, err
}

// ClientEnv are the WALCAST_* variables of walcast's client commands
// (cmd/walcast): servers ignore them.
var ClientEnv = []string{"WALCAST_ADDR", "WALCAST_CONTEXT", "WALCAST_CLIENT_CONFIG", "WALCAST_TOKEN_FILE", "WALCAST_OUTPUT"}

// envVerdict says what an unknown WALCAST_ variable is: an error (a likely
// typo of a setting), "" to ignore it silently, or a warning.
func envVerdict(name string, byEnv map[string]string) (warning string, err error) {
	if slices.Contains(ClientEnv, name) || kubernetesEnv.MatchString(name) {
		return "", nil
	}
	rest := strings.TrimPrefix(name, envPrefix)
	section, _, _ := strings.Cut(rest, "_")
	nearest, dist := "", math.MaxInt
	for env := range byEnv {
		if d := editdist.Levenshtein(name, env); d < dist || d == dist && env < nearest {
			nearest, dist = env, d
		}
		if strings.HasSuffix(env, "_"+rest) {
			return "", fmt.Errorf("%w: unknown environment variable %s (did you mean %s?)", ErrConfig, name, env)
		}
	}
	if dist <= 3 || sections[section] {
		return "", fmt.Errorf("%w: unknown environment variable %s (did you mean %s?)", ErrConfig, name, nearest)
	}
	return fmt.Sprintf("ignoring the environment variable %s: it is no walcast setting (settings are WALCAST_<SECTION>_<KEY>, e.g. WALCAST_LOG_LEVEL)", name), nil
}

// envPrefix starts every environment variable of a setting.
const envPrefix = "WALCAST_"

// kubernetesEnv matches the variables Kubernetes sets for a Service named
// walcast in every pod of its namespace (docker links had the same).
var kubernetesEnv = regexp.MustCompile(`^WALCAST_(SERVICE_HOST|SERVICE_PORT(_[A-Z0-9_]+)?|PORT|PORT_\d+_(TCP|UDP|SCTP)(_(PORT|PROTO|ADDR))?)$`)

// sections are the first components of the settings' keys, upper-cased:
// a variable in one of them that names no setting is a typo.
var sections = func() map[string]bool {
	out := map[string]bool{}
	for key := range keysOf(reflect.TypeOf(Config{}), "") {
		first, _, _ := strings.Cut(key, ".")
		first, _, _ = strings.Cut(first, "_") // data_dir: DATA
		out[strings.ToUpper(first)] = true
	}
	return out
}()

// LoadWithWarnings builds the configuration from the defaults, the YAML
// file at path (if path is not empty), the environment (environ, e.g.
// os.Environ()) and the flags of fs that were set. Flags are mapped to keys
// by flagKey (a flag "data-dir" to "data_dir", "api-addr" to "api.addr").
//
// Unknown keys in the file are errors, so a typo cannot silently leave a
// default in place. Unknown WALCAST_ variables are sorted by what they
// probably are (envVerdict): a likely typo of a setting (in a settings
// section, such as WALCAST_BROADCAST_TOMBSTONE_MAX_CONT, or close to a
// setting's name) is an error; the variables Kubernetes derives from a
// Service named walcast (WALCAST_PORT, WALCAST_SERVICE_HOST, ...) and those
// of the client commands (ClientEnv) are ignored; any other is ignored with
// a warning, returned for the caller to show.
func LoadWithWarnings(path string, environ []string, fs *pflag.FlagSet, flagKey func(string) string) (Config, []string, error) {
	known := keysOf(reflect.TypeOf(Config{}), "")
	k := koanf.New(".")
	if path != "" {
		if _, err := os.Stat(path); err != nil {
			return Config{}, nil, fmt.Errorf("%w: config file: %w", ErrConfig, err)
		}
		if err := k.Load(file.Provider(path), yaml.Parser()); err != nil {
			return Config{}, nil, fmt.Errorf("%w: config file %s: %w", ErrConfig, path, err)
		}
	}
	byEnv := make(map[string]string, len(known))
	for key := range known {
		byEnv[envPrefix+strings.ToUpper(strings.ReplaceAll(key, ".", "_"))] = key
	}
	var envErr error
	var warnings []string
	ep := env.Provider(".", env.Opt{
		Prefix:      envPrefix,
		EnvironFunc: func() []string { return environ },
		TransformFunc: func(name, value string) (string, any) {
			key, ok := byEnv[name]
			if !ok {
				w, err := envVerdict(name, byEnv)
				envErr = errors.Join(envErr, err)
				if w != "" {
					warnings = append(warnings, w)
				}
				return "", nil
			}
			if known[key] == reflect.Slice {
				return key, splitList(value)
			}
			return key, value
		},
	})
	if err := k.Load(ep, nil); err != nil {
		return Config{}, nil, fmt.Errorf("%w: environment: %w", ErrConfig, err)
	}
	if envErr != nil {
		return Config{}, nil, envErr
	}
	if fs != nil {
		fp := posflag.ProviderWithFlag(fs, ".", k, func(f *pflag.Flag) (string, any) {
			if !f.Changed || flagKey == nil {
				return "", nil
			}
			key := flagKey(f.Name)
			if key == "" {
				return "", nil
			}
			return key, posflag.FlagVal(fs, f)
		})
		if err := k.Load(fp, nil); err != nil {
			return Config{}, nil, fmt.Errorf("%w: flags: %w", ErrConfig, err)
		}
	}
	for _, key := range k.Keys() {
		if _, ok := known[key]; !ok {
			return Config{}, nil, fmt.Errorf("%w: unknown setting %q", ErrConfig, key)
		}
	}
	c := Default()
	err := k.UnmarshalWithConf("", &c, koanf.UnmarshalConf{DecoderConfig: &mapstructure.DecoderConfig{
		DecodeHook: mapstructure.ComposeDecodeHookFunc(
			mapstructure.TextUnmarshallerHookFunc(),
			mapstructure.StringToSliceHookFunc(","),
		),
		Result:           &c,
		WeaklyTypedInput: true,
		TagName:          configTag,
	}})
	if err != nil {
		return Config{}, nil, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	slices.Sort(warnings)
	return c, warnings, c.Validate()
}

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

// configTag is the struct tag naming a setting's key: the YAML key, which
// the file, the environment and `walcast config print` share.
const configTag = "yaml"

// keysOf lists the leaf keys of a config struct type with their kinds.
func keysOf(t reflect.Type, prefix string) map[string]reflect.Kind {
	out := map[string]reflect.Kind{}
	for i := range t.NumField() {
		f := t.Field(i)
		tag, _, _ := strings.Cut(f.Tag.Get(configTag), ",")
		if tag == "" || tag == "-" {
			continue
		}
		key := prefix + tag
		if f.Type.Kind() == reflect.Struct {
			for k, v := range keysOf(f.Type, key+".") {
				out[k] = v
			}
			continue
		}
		out[key] = f.Type.Kind()
	}
	return out
}
