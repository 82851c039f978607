// Builds the web UI into api/ui_dist (committed; the api pods serve it, no Node at run time).
import { writeFileSync, mkdirSync } from 'node:fs';
import { resolve } from 'node:path';
import { defineConfig } from 'vite';
import preact from '@preact/preset-vite';

const outDir = resolve(__dirname, '../api/ui_dist');

// _app/version.json as llama-server's UI has it: the build's version, for cache busting.
function versionFile() {
  let dir = outDir;
  return {
    name: 'llamaq-version',
    configResolved(config) {
      dir = resolve(config.root, config.build.outDir);
    },
    writeBundle() {
      mkdirSync(resolve(dir, '_app'), { recursive: true });
      const version = { version: String(Date.now()) };
      writeFileSync(resolve(dir, '_app/version.json'), JSON.stringify(version) + '\n');
    },
  };
}

export default defineConfig({
  base: './', // relative URLs: the page works under any --api-prefix
  plugins: [preact(), versionFile()],
  build: {
    outDir,
    emptyOutDir: true,
    assetsDir: '_app/immutable',
    sourcemap: false,
  },
});
