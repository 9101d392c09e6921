// docs/environment.md's tables of variables, made from plugin/util/env.cc's table. A table is the
// run of '|' lines after a line "<!-- env table SECTION ... -->". `env_doc DOC` (the test env_doc)
// fails when DOC's tables differ from the table's, printing the diff; `env_doc --write DOC` writes
// them anew.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <set>
#include <string>

#include <unistd.h>

#include "util/env.h"

int main(int argc, char** argv) {
  const bool write = argc == 3 && !strcmp(argv[1], "--write");
  if (argc != 2 && !write) return fprintf(stderr, "usage: env_doc [--write] DOC\n"), 2;
  const char* doc = argv[argc - 1];
  std::ifstream in(doc);
  if (!in) return fprintf(stderr, "env_doc: cannot read %s\n", doc), 2;
  const std::string mark = "<!-- env table ";
  std::string line, old, made;
  std::set<std::string> sections, rows;
  bool inTable = false;
  while (std::getline(in, line)) {
    old += line + "\n";
    if (inTable && line.starts_with("|")) continue;
    made += line + "\n";
    if (!(inTable = line.starts_with(mark))) continue;
    const std::string section = line.substr(mark.size(), line.find(' ', mark.size()) - mark.size());
    sections.insert(section);
    made += "| variable | values | default | meaning |\n|---|---|---|---|\n";
    for (const auto& v : lowrank::env::table())
      if (section == v.section)
        made += std::string("| `") + v.name + "` | " + v.values + " | " + v.byDefault + " | " +
                v.meaning + " |\n";
  }
  for (const auto& v : lowrank::env::table()) {
    if (*v.section && !sections.count(v.section))
      return fprintf(stderr, "env_doc: %s has no line \"%s%s\"\n", doc, mark.c_str(), v.section), 1;
    if (!rows.insert(std::string(v.section) + " " + v.name).second)
      return fprintf(stderr, "env_doc: %s twice in table %s\n", v.name, v.section), 1;
  }
  if (write) return std::ofstream(doc) << made ? 0 : 1;
  if (made == old) return printf("%s: its tables are plugin/util/env.cc's\n", doc), 0;
  const std::string tmp = std::string(P_tmpdir) + "/env_doc." + std::to_string(getpid()) + ".md";
  std::ofstream(tmp) << made;
  std::fflush(stdout);
  if (std::system(("diff -u '" + std::string(doc) + "' '" + tmp + "'").c_str())) {}
  std::remove(tmp.c_str());
  fprintf(stderr, "%s: its tables differ from plugin/util/env.cc's (above: - the page, + the "
          "table); to write them anew: %s --write %s\n", doc, argv[0], doc);
  return 1;
}
