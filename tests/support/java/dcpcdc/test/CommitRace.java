/*
 * One of several JVMs committing to the same Delta log through a log store, as Delta's commit
 * does, without Spark: each commit reads the log's latest version L (a listing, as Delta's
 * snapshot update) and writes _delta_log/<L+1>.json with overwrite=false; a writer refused with
 * java.nio.file.FileAlreadyExistsException reads the log again and retries, as Delta does.
 * Each commit's one line names its writer and number, so the files left say which commits
 * survived. tests/support/commit_race.py starts the JVMs and counts.
 *
 * Arguments: <log store class> <log folder> <writer name> <commits> <go file> [key=value...]
 * (Hadoop settings). The writer says it is ready (<go file>.<writer>.ready) and starts when
 * the go file exists, so that the JVMs' loops overlap from their first commit.
 */
package dcpcdc.test;

import java.io.File;
import java.nio.file.FileAlreadyExistsException;
import java.util.List;

import io.delta.storage.LogStore;
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.Path;

public class CommitRace {
    public static void main(String[] args) throws Exception {
        String storeClass = args[0];
        Path log = new Path(new File(args[1]).getAbsoluteFile().toURI());
        String writer = args[2];
        int commits = Integer.parseInt(args[3]);
        File go = new File(args[4]);

        Configuration conf = new Configuration();
        for (int i = 5; i < args.length; i++) {
            String[] setting = args[i].split("=", 2);
            conf.set(setting[0], setting[1]);
        }
        LogStore store = (LogStore) Class.forName(storeClass)
            .getConstructor(Configuration.class).newInstance(conf);
        new File(go.getPath() + "." + writer + ".ready").createNewFile();
        long deadline = System.nanoTime() + 120_000_000_000L;
        while (!go.exists()) {
            if (System.nanoTime() > deadline) {
                throw new IllegalStateException(writer + ": no go file " + go);
            }
            Thread.onSpinWait();
        }
        File folder = new File(args[1]);
        int refused = 0;
        for (int i = 0; i < commits; i++) {
            while (true) {
                Path file = new Path(log, String.format("%020d.json", latest(folder) + 1));
                try {
                    store.write(file, List.of(writer + "-" + i).iterator(), false, conf);
                    break;
                } catch (FileAlreadyExistsException e) {
                    refused++;
                }
            }
        }
        System.out.println(writer + ": " + commits + " commits, " + refused + " refused");
    }

    /** The highest N of the folder's N.json files, -1 if none. */
    private static long latest(File folder) {
        long found = -1;
        for (String name : folder.list()) {
            if (name.length() == 25 && name.endsWith(".json") && name.charAt(0) != '.') {
                found = Math.max(found, Long.parseLong(name.substring(0, 20)));
            }
        }
        return found;
    }
}
